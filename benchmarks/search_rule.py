"""The built-in search under the real keep rule, on problems drawn fresh by a seeded generator.

Each problem is a random function of the ten knobs of search_families' synthetic train.py: every
knob gets a random optimum (up to two octaves, or two logits, from its baseline value), a
random weight (log-uniform, so a few knobs matter and some barely), a third of the knobs do
nothing, a random pair interacts (the best of one moves with the other), and half the problems
have an out-of-memory region near the optimum. Nothing here is a fixed list of families: a run
draws `--problems` new ones from `--seed` (a fresh random seed unless given; printed, so a run
can be repeated).

The `knobs` proposer drives a night of `--proposals` proposals on each; every proposal is
decided by the real keep rule through benchmarks/keep_world.Night (runs of truth + N(0, σ), the
incumbent's re-runs, its runs beside a change), so the search sees the statuses and metrics
the rule records. Reported: the median closed share of the baseline's true regret after 30
proposals (1: the optimum found), its quartiles, and the runs spent.

    .venv/bin/python benchmarks/search_rule.py [--problems 24] [--seed N] [--proposals 30]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from keep_world import Commit, Night, World  # noqa: E402
from search_families import TRAIN_PY  # noqa: E402

from agent.core.config import TargetConfig  # noqa: E402
from agent.core.domain import (  # noqa: E402
    CrashKind,
    Experiment,
    ExperimentStatus,
    Sweep,
    SweepStatus,
    utcnow,
)
from agent.core.ports import ProposalContext  # noqa: E402
from agent.proposers.knobs import KnobsProposer, find_knobs  # noqa: E402
from agent.proposers.llm import apply_unified_diff  # noqa: E402

NOISE = 0.002  # the metric's seed noise (search_families.NOISE_SIGMA)
CONFIG = TargetConfig(command="python train.py", editable=("train.py",), metric="val_bpb",
                      budget_s=300, timeout_s=900)


def values_of(text: str) -> dict[str, float]:
    return {k.name: float(k.value) for k in find_knobs("train.py", text)}


@dataclass(frozen=True)
class Problem:
    """f(config) = 0.9 + Σ weight·distance² to each knob's optimum (in octaves or logits)."""

    optimum: dict[str, float]
    weight: dict[str, float]
    coupled: tuple[str, str, float] | None  # (a, b, k): a's optimum × (b / b0)^k
    memory: float | None  # OOM when WIDTH·DEPTH·BATCH_SIZE exceeds this × the baseline's
    base: dict[str, float]

    def __call__(self, c: dict[str, float]) -> float | None:
        if self.memory is not None and _mem(c) > self.memory * _mem(self.base):
            return None
        total = 0.9
        for name, w in self.weight.items():
            best = self.optimum[name]
            if self.coupled and name == self.coupled[0]:
                b = self.coupled[1]
                best *= (c[b] / self.base[b]) ** self.coupled[2]
            total += w * _dist(name, c[name], best)
        return total

    def best(self) -> float:
        return 0.9  # every term is zero at the optimum, which is kept feasible


def _mem(c: dict[str, float]) -> float:
    return c["WIDTH"] * c["DEPTH"] * c["BATCH_SIZE"]


def _dist(name: str, x: float, best: float) -> float:
    if name == "USE_SWIGLU":
        return 0.0 if x == best else 1.0
    if 0 < best < 1 and name in ("WARMUP_FRAC", "ADAM_BETA2", "WEIGHT_DECAY"):
        lx, lb = (math.log(v / (1 - v)) for v in (min(max(x, 1e-6), 1 - 1e-6), best))
        return (lx - lb) ** 2
    return math.log2(max(x, 1e-12) / best) ** 2


def draw(rng: random.Random) -> Problem:
    base = values_of(TRAIN_PY)
    optimum, weight = {}, {}
    names = list(base)
    dead = set(rng.sample(names, len(names) // 3))
    for name, v in base.items():
        if name == "USE_SWIGLU":
            optimum[name] = rng.choice([0.0, 1.0])
        elif 0 < v < 1 and name in ("WARMUP_FRAC", "ADAM_BETA2", "WEIGHT_DECAY"):
            logit = math.log(v / (1 - v)) + rng.uniform(-2.0, 2.0)
            optimum[name] = 1 / (1 + math.exp(-logit))
        else:
            optimum[name] = v * 2 ** rng.uniform(-2.0, 2.0)
        if name not in dead:
            weight[name] = math.exp(rng.uniform(math.log(0.001), math.log(0.03)))
    live = [n for n in weight if n != "USE_SWIGLU"]
    coupled = None
    if len(live) >= 2 and rng.random() < 0.5:
        a, b = rng.sample(live, 2)
        coupled = (a, b, rng.choice([-1.0, -0.5, 0.5, 1.0]))
    memory = None
    if rng.random() < 0.5:
        # near the optimum (or the baseline, whichever uses more): both stay feasible
        at_best = max(_mem(optimum) / _mem(base), 1.0)
        memory = at_best * rng.uniform(1.1, 1.6)
    return Problem(optimum, weight, coupled, memory, base)


class SearchNight(Night):
    """keep_world's night whose changes come from the knobs proposer on one problem."""

    def __init__(self, problem: Problem, seed: int) -> None:
        super().__init__(_rule(), World("search", sigma=1.0), random.Random(f"noise-{seed}"))
        self.problem, self.proposer = problem, KnobsProposer(seed=seed)
        self.text = TRAIN_PY
        self.history: list[Experiment] = []

    def truth(self, text: str) -> float | None:
        value = self.problem(values_of(text))
        return None if value is None else value / NOISE

    def start(self) -> None:
        truth = self.truth(self.text)
        assert truth is not None
        self.head = Commit(truth)
        self.settle(self.head, baseline=True)
        self.history.append(Experiment(1, 1, ExperimentStatus.KEPT, "baseline", "", "baseline",
                                       is_baseline=True, metric=self._mean(self.head)))

    def _mean(self, c: Commit) -> float:
        return statistics.fmean(r.metric for r in c.runs) * NOISE

    def step(self, k: int) -> None:
        ctx = ProposalContext(self._sweep(), {"train.py": self.text}, list(self.history))
        p = self.proposer.propose(ctx)
        if p is None:
            return
        new = apply_unified_diff(p.diff, {"train.py": self.text})["train.py"]
        best = self._mean(self.head)
        exp = Experiment(len(self.history) + 1, 1, ExperimentStatus.DISCARDED, p.description,
                         p.diff, p.proposer, meta=p.meta, best_before=best)
        truth = self.truth(new)
        self.runs += 1
        if truth is None:
            self.history.append(replace(exp, status=ExperimentStatus.CRASHED,
                                        crash_kind=CrashKind.FUNDAMENTAL,
                                        reason="torch.OutOfMemoryError: CUDA out of memory"))
            return
        self.due(k)
        change = Commit(truth)
        kept = self.settle(change, baseline=False)
        self.runs -= 1  # settle counted its first run
        status = ExperimentStatus.KEPT if kept else ExperimentStatus.DISCARDED
        self.history.append(replace(exp, status=status, metric=self._mean(change)))
        if kept:
            self.retire(self.head)
            self.head, self.text = change, new
        else:
            self.retire(change)

    def _sweep(self) -> Sweep:
        base = self.history[0].metric if self.history else None
        return Sweep(1, "bench", "/synthetic", "overnight/bench", SweepStatus.RUNNING, "knobs",
                     CONFIG, None, base, self._mean(self.head), None, None, utcnow())

    def regret(self) -> float:
        value = self.problem(values_of(self.text))
        assert value is not None
        return value - self.problem.best()


def _rule():  # type: ignore[no-untyped-def]
    from agent.rules.decide import Rule

    return Rule()


def one(args: tuple[int, int, int]) -> tuple[float, int]:
    seed, index, proposals = args
    problem = draw(random.Random(f"problem-{seed}-{index}"))
    night = SearchNight(problem, seed * 1000 + index)
    night.start()
    base = night.regret()
    for k in range(proposals):
        night.step(k)
    return (base - night.regret()) / base, night.runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=24)
    ap.add_argument("--seed", type=int, default=None, help="default: a fresh random seed")
    ap.add_argument("--proposals", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    jobs = [(seed, i, args.proposals) for i in range(args.problems)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        out = list(pool.map(one, jobs))
    shares = [s for s, _ in out]
    q = statistics.quantiles(shares, n=4)
    runs = sum(r for _, r in out) / len(out) / args.proposals
    print(f"{args.problems} problems drawn with seed {seed}, {args.proposals} proposals each: "
          f"median closed share {statistics.median(shares):.3f} (quartiles {q[0]:.3f}, "
          f"{q[2]:.3f}); runs per proposal {runs:.2f}")
    print("closed shares: " + " ".join(f"{s:.2f}" for s in shares))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
