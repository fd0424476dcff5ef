"""The keep rule's `discard_below` setting: runs a proposal against the share of clear gains kept,
on the stationary night and on held-out worlds (keep_world's shapes), through the real decide().

    .venv/bin/python benchmarks/discard_frontier.py --sweeps 500

A look's t below discard_below · k discards at once: a higher value spends fewer runs on changes
that are not better and gives up more gains that need a second run to show.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=500)
    ap.add_argument("--values", default="0.5,0.75,1.0", help="discard_below values to compare")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    worlds = [World("stationary σ=1", sigma=1.0, source=None), World("another mix", mix="fresh"),
              World("rare small gains", mix="rare"), World("heavy tails (t3)", noise="t3")]
    print(f"{args.sweeps} sweeps; per world: runs a proposal / ≥3σ kept / FDR / true gain (σ)")
    for value in (float(v) for v in args.values.split(",")):
        cells = []
        for w in worlds:
            r = row(simulate(Rule(discard_below=value), w, args.sweeps, args.seed))
            big = "–" if r["big_kept"] != r["big_kept"] else f"{r['big_kept']:.1%}"
            cells.append(f"{w.name}: {r['runs']:.2f} / {big} / {r['fdr']:.1%} / {r['gain']:.2f}")
        print(f"discard_below {value:g}: " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
