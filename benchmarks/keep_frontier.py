"""Why the fixed-budget night's gain and a held FDR pull apart: the keep rule with its night level
(ADDIS) replaced by fixed levels, on the fixed-budget night and on a night of rare small gains.

The same test (agent.rules.decide) with α_t held at a constant instead of agent.rules.fdr.level:
a larger α keeps more of the small gains that make up most of a night's true gain, and more
nulls with them; where real gains are rare those nulls are most of the keeps. Printed per level:
the fixed-budget night's true gain (σ) and FDR, and the FDR (the mean over nights, and pooled)
of a night of rare small gains (keep_world's "rare" mix).

    .venv/bin/python benchmarks/keep_frontier.py [--sweeps 300] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from budget_report import figures  # noqa: E402
from curve_world import CurveWorld, Policy, simulate_budget  # noqa: E402
from keep_world import World, simulate  # noqa: E402

from agent.rules import fdr  # noqa: E402
from agent.rules.decide import Rule  # noqa: E402
from agent.rules.prune import PrunePolicy  # noqa: E402

LEVELS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    night = fdr.level
    print(f"{'level':<14}{'budget gain':>12}{'budget FDR':>11}{'rare FDR':>10}{'pooled':>8}")
    for label, level in [("ADDIS (α 0.2)", None), *((f"fixed {a:g}", a) for a in LEVELS)]:
        fdr.level = night if level is None else (lambda _t, _a, v=level: v)  # type: ignore
        budget = figures(simulate_budget(Rule(), CurveWorld(), Policy(PrunePolicy()),
                                         args.sweeps, args.seed))
        rare = simulate(Rule(), World("rare", mix="rare"), args.sweeps, args.seed)
        pooled = rare.false_keeps / max(rare.keeps, 1)
        print(f"{label:<14}{budget['gain']:>12.2f}{budget['fdr']:>11.1%}{rare.fdr():>10.1%}"
              f"{pooled:>8.1%}", flush=True)
    fdr.level = night
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
