"""A change's own speed on a machine whose speed swings: are speed-changing winners judged?

keep_world's night (benchmarks/keep_world.py, the real agent.rules.decide.decide) on a time
budget, on a machine whose speed swings from run to run as the README's demo met it (the same
code at 3,500 to 23,000 tokens/s): the machine holds a speed factor e^N(0, `swing`) for 1–4
runs, then draws another. A slower stretch trains fewer steps, so every run in it is worse by
`k`·ln(1/factor) σ (k = 1: a machine at half speed costs 0.7σ). Half of the changes that do
something also change their own speed by ×e^U(−0.7, 0.7) (×0.5 to ×2), and that moves their
metric the same way: a change twice as fast trains twice the steps, k·ln 2 σ better.

Printed per world: null keeps, FDR (the mean over nights of false keeps / max(keeps, 1)), ≥ 3σ
gains kept, and of the ≥ 3σ winners whose speed changed: kept, and discarded "not judged"
(better beside the incumbent, its speed ratio never counted).

    .venv/bin/python benchmarks/speed_world.py --sweeps 300

This world was built to test item 3 of issue #52 (a change's speed identified however the
machine swings between its pairs), after the rule's change was written and before it was
measured here; nothing in the rule was tuned against it.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from keep_world import PROPOSALS, Commit, Night, Tally, World, _effect  # noqa: E402

from agent.core.record import Ending  # noqa: E402
from agent.rules.decide import Rule  # noqa: E402


@dataclass(frozen=True)
class SwingWorld:
    name: str
    swing: float = 0.4  # σ of the machine's log speed factor, held 1–4 runs
    k: float = 1.0  # σ of metric per e-fold of speed (time budget: fewer steps, worse)
    own_speed: float = 0.5  # share of the changes with an effect that change their speed
    hold: tuple[int, int] = (1, 4)


class SwingMachine:
    def __init__(self, sw: SwingWorld, rng: random.Random) -> None:
        self.sw, self.rng, self.left, self.factor = sw, rng, 0, 1.0

    def tick(self) -> tuple[float, float]:
        if self.left <= 0:
            self.factor = self.rng.lognormvariate(0.0, self.sw.swing)
            self.left = self.rng.randint(*self.sw.hold)
        self.left -= 1
        return -self.sw.k * math.log(self.factor), self.factor


@dataclass
class SpeedTally(Tally):
    fast_winners: int = 0  # ≥ 3σ gains whose own speed changed
    fast_kept: int = 0
    fast_not_judged: int = 0


class SwingNight(Night):
    def __init__(self, rule: Rule, sw: SwingWorld, rng: random.Random) -> None:
        super().__init__(rule, World(sw.name), rng)
        self.sw = sw
        self.machine = SwingMachine(sw, rng)  # type: ignore[assignment]

    def propose(self, tally: Tally) -> None:
        assert isinstance(tally, SpeedTally)
        rng, head = self.effects, self.head
        effect = _effect(rng, self.world.mix)
        ratio = 1.0
        if effect and rng.random() < self.sw.own_speed:
            ratio = math.exp(rng.uniform(-0.7, 0.7))
            effect -= self.sw.k * math.log(ratio)  # faster: more steps in the budget
        change = Commit(head.truth + effect, head.speed * ratio)
        kept = self.settle(change, baseline=False)
        big = -effect >= 3
        tally.count(effect, big, kept)
        if big and ratio != 1.0:
            tally.fast_winners += 1
            tally.fast_kept += kept
            tally.fast_not_judged += self.verdict is not None and \
                self.verdict.ending is Ending.NOT_JUDGED
        self.conclude(change, kept)


def worlds() -> list[SwingWorld]:
    return [SwingWorld("swinging machine (×e^N(0, 0.4), 1–4 runs)"),
            SwingWorld("swinging more (×e^N(0, 0.6), 1–2 runs)", swing=0.6, hold=(1, 2)),
            SwingWorld("swinging, speed costs 2σ an e-fold", k=2.0)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    t0 = time.perf_counter()
    print(f"{args.sweeps} nights × {PROPOSALS} proposals a world")
    print(f"{'world':<44}{'null keeps':>11}{'FDR':>7}{'≥3σ kept':>10}{'fast winners kept':>19}"
          f"{'not judged':>12}{'runs/prop':>10}{'true gain':>10}")
    for sw in worlds():
        t = SpeedTally()
        rng = random.Random(args.seed)
        for _ in range(args.sweeps):
            SwingNight(Rule(), sw, rng).run(t)
        n = max(t.fast_winners, 1)
        print(f"{sw.name:<44}{t.null_keeps / max(t.nulls, 1):>11.1%}{t.fdr():>7.1%}"
              f"{t.big_keeps / max(t.big, 1):>10.1%}{t.fast_kept / n:>19.1%}"
              f"{t.fast_not_judged / n:>12.1%}{t.runs / t.proposals:>10.2f}"
              f"{statistics.fmean(t.gains):>10.2f}", flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
