"""What the early stop could save at most on the fixed-budget night (benchmarks/keep_rule.py
--night budget): oracles that know each change's true effect and stop its runs at the first
check (25 % of the budget), against the keep rule alone and with the real early stop.

Rows: no stop; the real early stop (agent.rules.prune at agent.rules.decide.stop_level); an
oracle that stops every harmful change at 25 % (any real stop with a bounded error stops no
more of them, and costs at least as much); an oracle that also stops every null change (what a
futility stop at a gain worth having would need, if a null's curve could be told from a
winner's at 25 %). The true gain is the final best's true improvement in σ, over the same
nights (common random numbers).

    .venv/bin/python benchmarks/futility_ceiling.py --sweeps 200
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from budget_report import HELDOUT  # noqa: E402
from curve_world import BudgetNight, CurveTally, CurveWorld, Policy  # noqa: E402

from agent.rules.decide import Rule  # noqa: E402
from agent.rules.prune import PrunePolicy  # noqa: E402


class Oracle(BudgetNight):
    """Stops a change's run at the first check when its true effect is in `stop`."""

    stop: tuple[str, ...] = ()

    def _judge(self, c, points, k):  # type: ignore[no-untyped-def]
        assert self.change is not None
        kind = "null" if self.change.effect == 0 else (
            "harmful" if self.change.effect > 0 else "helpful")
        if kind in self.stop:
            self.stopped = "check"
            return 1 / self.rule.max_runs
        return 1.0


def night_gains(world: CurveWorld, sweeps: int, seed: int, policy: Policy,
                stop: tuple[str, ...] | None) -> list[float]:
    tally = CurveTally()
    for sweep in range(sweeps):
        if stop is None:
            BudgetNight(Rule(), world, policy, seed * 100_003 + sweep).run(tally)
        else:
            night = Oracle(Rule(), world, Policy(), seed * 100_003 + sweep)
            night.stop = stop
            night.run(tally)
    return tally.gains


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rows = {
        "no early stop": (Policy(), None),
        "the early stop (β = 1 %)": (Policy(PrunePolicy()), None),
        "oracle: every harmful change at 25 %": (Policy(), ("harmful",)),
        "oracle: every harmful and null at 25 %": (Policy(), ("harmful", "null")),
    }
    for world in (CurveWorld(), HELDOUT):
        print(f"{world.name}: {args.sweeps} nights of {world.budget:g} full runs")
        base = None
        for name, (policy, stop) in rows.items():
            g = night_gains(world, args.sweeps, args.seed, policy, stop)
            base = base or g
            d = [x - y for x, y in zip(g, base, strict=True)]
            se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else math.nan
            print(f"  {name:<42}{statistics.fmean(g):>7.2f}σ  ({statistics.fmean(d):+.2f} ± "
                  f"{se:.2f}σ paired)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
