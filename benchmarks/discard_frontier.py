"""A keep rule setting's trade-off: runs a proposal against the share of clear gains kept, on the
stationary night and on held-out worlds (keep_world's shapes), through the real decide().

    .venv/bin/python benchmarks/discard_frontier.py --sweeps 500
    .venv/bin/python benchmarks/discard_frontier.py --setting incumbent_every --values 8,0

`discard_below` (the default): a look's t below discard_below · k discards at once, so a higher
value spends fewer runs on changes that are not better and gives up more gains that need a
second run to show. `incumbent_every`: the best's re-runs cost runs (they count) and buy a
tighter incumbent mean, and they follow a drift the speed does not show.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from keep_rule import row  # noqa: E402
from keep_world import World, simulate  # noqa: E402

from agent.rules.decide import Rule  # noqa: E402

INTEGERS = ("incumbent_every", "max_runs", "baseline_runs")
SETTINGS = ("discard_below", "fdr", *INTEGERS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=500)
    ap.add_argument("--setting", default="discard_below", choices=SETTINGS,
                    help="the Rule setting to vary")
    ap.add_argument("--values", default="0.5,0.75,1.0", help="its values to compare")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    worlds = [World("stationary σ=1", sigma=1.0, source=None), World("another mix", mix="fresh"),
              World("rare small gains", mix="rare"), World("heavy tails (t3)", noise="t3"),
              World("slow drift (0.15σ a run)", drift=0.15)]
    kind = int if args.setting in INTEGERS else float
    print(f"{args.sweeps} sweeps; per world: runs a proposal / ≥3σ kept / FDR / true gain (σ)")
    for value in (kind(v) for v in args.values.split(",")):
        cells = []
        for w in worlds:
            rule = Rule(**{args.setting: value})  # type: ignore[arg-type]
            r = row(simulate(rule, w, args.sweeps, args.seed))
            big = "–" if r["big_kept"] != r["big_kept"] else f"{r['big_kept']:.1%}"
            cells.append(f"{w.name}: {r['runs']:.2f} / {big} / {r['fdr']:.1%} / {r['gain']:.2f}")
        print(f"{args.setting} {value:g}: " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
