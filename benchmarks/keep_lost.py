"""Where the clear gains the keep rule does not keep go: each ≥ 3σ gain that ended unkept, by how
its experiment ended, in the worlds of benchmarks/keep_rule.py (the same nights, the real decide()).

    .venv/bin/python benchmarks/keep_lost.py                  # 1,000 nights a world
    .venv/bin/python benchmarks/keep_lost.py --sweeps 300 --heldout

How an experiment ends, as its final verdict says:
- "first run": discarded after one run (t < `discard_below`; a first run keeps nothing);
- "level": discarded at a later look with p ≤ 0.05 but above the night's level α_t (the price
  of holding the FDR over the night);
- "weak test": discarded at a later look with p > 0.05;
- "not judged": better beside the incumbent, but its speed never settled.
"busy" counts those whose runs, or the incumbent runs beside them, met a busy phase of the
machine (a metric 2–5σ worse); in a stationary world it is 0.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from keep_rule import heldout  # noqa: E402
from keep_world import Night, Tally, World  # noqa: E402

from agent.core.record import Ending  # noqa: E402
from agent.rules.decide import Rule, Verdict  # noqa: E402

ENDINGS = ("first run", "level", "weak test", "not judged")


def ending(v: Verdict) -> str:
    if v.ending is Ending.NOT_JUDGED:
        return "not judged"
    if v.n <= 1:
        return "first run"
    return "level" if v.p_value is not None and v.p_value <= 0.05 else "weak test"


def lost_table(world: World, sweeps: int, seed: int) -> str:
    tally, rng = Tally(), random.Random(seed)
    for _ in range(sweeps):
        Night(Rule(), world, rng).run(tally)
    ends: Counter[str] = Counter()
    busy: Counter[str] = Counter()
    for verdict, busy_runs in tally.lost:
        ends[ending(verdict)] += 1
        busy[ending(verdict)] += busy_runs > 0
    big = max(tally.big, 1)
    cells = " | ".join(f"{100 * ends[e] / big:.1f} % ({busy[e]})" for e in ENDINGS)
    return (f"| {world.name} | {tally.big} | {100 * tally.big_keeps / big:.1f} % | {cells} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--heldout", action="store_true", help="the held-out worlds too")
    args = ap.parse_args()
    worlds = [World("stationary σ=1", source=None), World("shifting, summary", shifting=True),
              World("shifting, progress lines", shifting=True, source="progress")]
    if args.heldout:
        worlds += [w for w in heldout() if w.mix == "default"]
    print(f"≥ 3σ gains by how they ended, {args.sweeps} nights a world, seed {args.seed}; "
          "in brackets: those that met a busy phase")
    print("| world | ≥ 3σ gains | kept | " + " | ".join(ENDINGS) + " |")
    print("| --- " * (3 + len(ENDINGS)) + "|")
    for world in worlds:
        print(lost_table(world, args.sweeps, args.seed), flush=True)


if __name__ == "__main__":
    main()
