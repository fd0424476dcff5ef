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

`--family coupled` runs a held-out problem instead of generated ones: search_families' `coupled`
(eight knobs that matter, a log-scale LR whose best moves with WIDTH, integer WIDTH and DEPTH
that interact, an out-of-memory region 25 % past the optimum, a NaN region past 1.6× the
width's best LR), `--problems` nights of it with their own proposer seeds and noise.

Where the unclosed regret goes (`breakdown`), per problem (`--per-problem`) and in aggregate:
each proposal by what the truth says it was (a crash into the OOM or NaN region; a move of
knobs that do not matter; a keep that helped; a keep that did not; a discard of a true
improvement, and of one of at least 1σ; a rightful discard), tagged when it re-tests a
near-miss, combines two, or runs a configuration already run; the runs a proposal; and the
regret left after the last proposal split exactly into "never tried" (the best configuration
ever run is that far from the optimum), "tried, not kept" (a better configuration than any
head ran and was discarded) and "kept, then lost" (the head was better once and a later keep
made it worse), each as a share of the baseline's regret.

`--oracle` measures what the search cannot reach by itself: "dead" hides the knobs that do
nothing from it (marked `knobs: skip`), "noise" runs without seed noise, "both".

    .venv/bin/python benchmarks/search_rule.py [--problems 24] [--seed N] [--proposals 30]
        [--family coupled] [--per-problem] [--oracle dead|noise|both]
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
from search_families import CRASH_LOG, FAMILIES, TRAIN_PY  # noqa: E402

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
from agent.core.record import RECORD_KEY  # noqa: E402
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

    def crash(self, c: dict[str, float]) -> str | None:
        return "oom" if self(c) is None else None

    def live(self) -> set[str]:
        """The knobs that matter (the coupled pair are both live)."""
        return set(self.weight)


@dataclass(frozen=True)
class Heldout:
    """A family of search_families as a problem: the held-out shape no generator tunes."""

    family: str
    base: dict[str, float]

    def __call__(self, c: dict[str, float]) -> float | None:
        out = FAMILIES[self.family](c)
        return None if isinstance(out, str) else out

    def crash(self, c: dict[str, float]) -> str | None:
        out = FAMILIES[self.family](c)
        return out if isinstance(out, str) else None

    def best(self) -> float:
        return 0.9  # search_families.OPTIMUM

    def live(self) -> set[str]:
        """Knobs whose move from the baseline (×2, ÷2, a flip) changes the metric."""
        out = set()
        for name, v in self.base.items():
            moves = [1.0 - v] if name == "USE_SWIGLU" else [v * 2, v / 2, v * 1.5, v / 1.5]
            for new in moves:
                a, b = self({**self.base, name: new}), self(self.base)
                if a is not None and b is not None and abs(a - b) > 1e-12:
                    out.add(name)
                    break
        return out


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


@dataclass(frozen=True)
class Step:
    """One proposal as the truth sees it (`kind`) and what it cost."""

    kind: str  # none | oom | nan | dead | kept-helped | kept-no-help | discarded-gain | discarded
    runs: int
    move: str  # the proposer's meta["move"]: explore, exploit, momentum, retest, combine...
    revisit: bool  # a configuration already run
    gain: float  # the true improvement over the head (metric units; > 0 better)


KINDS = ("oom", "nan", "dead", "kept-helped", "kept-no-help", "discarded-gain", "discarded",
         "none")


ORACLES = ("dead", "noise", "both")
SKIP = "knobs: skip"  # agent.proposers.knob_base.SKIP: the proposer leaves such a line alone


class SearchNight(Night):
    """keep_world's night whose changes come from the knobs proposer on one problem.

    `oracle` (what the search cannot reach by itself): "dead", the knobs that do nothing are
    marked `knobs: skip` in the file the proposer sees, so it never moves them; "noise", runs
    without seed noise (σ → 0); "both"."""

    def __init__(self, problem: Problem | Heldout, seed: int, oracle: str | None = None) -> None:
        sigma = 1e-6 if oracle in ("noise", "both") else 1.0
        super().__init__(_rule(), World("search", sigma=sigma), random.Random(f"noise-{seed}"))
        self.problem, self.proposer = problem, KnobsProposer(seed=seed)
        self.hidden = set(problem.base) - problem.live() if oracle in ("dead", "both") else set()
        self.text = TRAIN_PY
        self.history: list[Experiment] = []
        self.steps: list[Step] = []
        self.live = problem.live()
        self.seen: set[tuple[tuple[str, float], ...]] = {_key(values_of(TRAIN_PY))}
        self.best_run = self.best_head = self._true(TRAIN_PY)

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

    def _true(self, text: str) -> float:
        value = self.problem(values_of(text))
        assert value is not None
        return value

    def shown(self, text: str) -> str:
        """The file as the proposer sees it: the oracle's dead knobs marked `knobs: skip`."""
        return "".join(line.replace("  # ", f"  # {SKIP}; ", 1)
                       if line.split(" = ")[0] in self.hidden else line
                       for line in text.splitlines(keepends=True))

    def step(self, k: int) -> None:
        shown = self.shown(self.text)
        ctx = ProposalContext(self._sweep(), {"train.py": shown}, list(self.history))
        p = self.proposer.propose(ctx)
        if p is None:
            self.steps.append(Step("none", 0, "", False, 0.0))
            return
        runs = self.runs
        new = apply_unified_diff(p.diff, {"train.py": shown})["train.py"]
        new = new.replace(f"  # {SKIP}; ", "  # ")
        old_values, values = values_of(self.text), values_of(new)
        key = _key(values)
        revisit, move = key in self.seen, str(p.meta.get("move", ""))
        self.seen.add(key)
        best = self._mean(self.head)
        exp = Experiment(len(self.history) + 1, 1, ExperimentStatus.DISCARDED, p.description,
                         p.diff, p.proposer, meta=p.meta, best_before=best)
        truth = self.truth(new)
        self.runs += 1
        if truth is None:
            crash = self.problem.crash(values) or "oom"
            self.history.append(replace(exp, status=ExperimentStatus.CRASHED,
                                        crash_kind=CrashKind.FUNDAMENTAL,
                                        reason=CRASH_LOG[crash].splitlines()[0],
                                        log_tail=CRASH_LOG[crash]))
            self.steps.append(Step(crash, self.runs - runs, move, revisit, 0.0))
            return
        self.due(k)
        change = Commit(truth)
        kept = self.settle(change, baseline=False)
        self.runs -= 1  # settle counted its first run
        status = ExperimentStatus.KEPT if kept else ExperimentStatus.DISCARDED
        assert self.verdict is not None
        # the verdict's record in meta, as the engine writes it (domain.finished_meta): the
        # search reads each run's gain from it (agent.analysis.trials.gain_of)
        meta = {**p.meta, RECORD_KEY: self.verdict.record().to_json()}
        self.history.append(replace(exp, status=status, metric=self._mean(change), meta=meta))
        gain = self._true(self.text) - self._true(new)
        moved_knobs = {n for n in values if values[n] != old_values.get(n)}
        if not moved_knobs & self.live:
            kind = "dead"
        elif kept:
            kind = "kept-helped" if gain > 0 else "kept-no-help"
        else:
            kind = "discarded-gain" if gain > 0 else "discarded"
        self.steps.append(Step(kind, self.runs - runs, move, revisit, gain))
        self.best_run = min(self.best_run, self._true(new))
        if kept:
            self.retire(self.head)
            self.head, self.text = change, new
            self.best_head = min(self.best_head, self._true(new))
        else:
            self.retire(change)

    def split(self) -> tuple[float, float, float]:
        """The regret left, exactly: never tried + tried, not kept + kept, then lost."""
        final = self._true(self.text)
        return (self.best_run - self.problem.best(), self.best_head - self.best_run,
                final - self.best_head)

    def _sweep(self) -> Sweep:
        base = self.history[0].metric if self.history else None
        return Sweep(1, "bench", "/synthetic", "overnight/bench", SweepStatus.RUNNING, "knobs",
                     CONFIG, None, base, self._mean(self.head), None, None, utcnow())

    def regret(self) -> float:
        value = self.problem(values_of(self.text))
        assert value is not None
        return value - self.problem.best()


def _key(values: dict[str, float]) -> tuple[tuple[str, float], ...]:
    return tuple(sorted(values.items()))


def _rule():  # type: ignore[no-untyped-def]
    from agent.rules.decide import Rule

    return Rule()


@dataclass(frozen=True)
class Outcome:
    """One night: its closed share, runs, proposals by kind and the regret left, split."""

    closed: float
    runs: int
    steps: tuple[Step, ...]
    split: tuple[float, float, float]  # never tried, tried not kept, kept then lost (÷ base)
    knobs: dict[str, float]  # one-knob gains left at the final head by why (÷ base), KNOB_WHY


KNOB_WHY = ("never moved", "only the other way", "the right way from here, not kept",
            "the right way, not from here")
LOGIT = ("WARMUP_FRAC", "ADAM_BETA2", "WEIGHT_DECAY")


def knobs_left(night: SearchNight) -> dict[str, float]:
    """Per numeric knob at the final head: the most a change of it alone would still gain (a
    grid of ±4 octaves, or logits, in twelfths; feasible values only), filed under why it is
    left: the knob never moved; moved only the other way; moved the right way, and a move that
    way from its final value ran and was not kept; moved the right way, but never on from its
    final value. Summed per why, in the baseline regret's units (the parts overlap where two
    knobs' gains interact, so they need not add up to the regret left)."""
    c, f0 = values_of(night.text), night._true(night.text)
    moves: list[tuple[str, float, float]] = []
    for e in night.history[1:]:
        for ch in e.meta.get("changes") or [e.meta]:
            try:
                moves.append((str(ch["knob"]), float(ch["old"]), float(ch["new"])))
            except (KeyError, TypeError, ValueError):
                continue  # a flip of a bool, or no change
    out = dict.fromkeys(KNOB_WHY, 0.0)
    for name, v in c.items():
        if name == "USE_SWIGLU":
            continue
        best_v, best_f = v, f0
        for j in range(-48, 49):
            if name in LOGIT and 0 < v < 1:
                u = math.log(v / (1 - v)) + j / 12 * math.log(2)
                new = 1 / (1 + math.exp(-u))
            else:
                new = v * 2 ** (j / 12)
            f = night.problem({**c, name: new})
            if f is not None and f < best_f:
                best_v, best_f = new, f
        if best_f >= f0:
            continue
        need = 1 if best_v > v else -1
        ways = {1 if new > old else -1 for n, old, new in moves if n == name and new != old}
        here = any(n == name and math.isclose(old, v) and (new - old) * need > 0
                   for n, old, new in moves)
        why = (KNOB_WHY[0] if not ways else KNOB_WHY[1] if need not in ways
               else KNOB_WHY[2] if here else KNOB_WHY[3])
        out[why] += f0 - best_f
    return out


def problem_of(family: str | None, seed: int, index: int) -> Problem | Heldout:
    if family is None:
        return draw(random.Random(f"problem-{seed}-{index}"))
    return Heldout(family, values_of(TRAIN_PY))


def one(args: tuple[int, int, int, str | None] | tuple[int, int, int, str | None, str | None]
        ) -> Outcome:
    seed, index, proposals, family, *oracle = args
    night = SearchNight(problem_of(family, seed, index), seed * 1000 + index,
                        oracle[0] if oracle else None)
    night.start()
    base = night.regret()
    for k in range(proposals):
        night.step(k)
    split = tuple(part / base for part in night.split())
    left = {why: gain / base for why, gain in knobs_left(night).items()}
    return Outcome((base - night.regret()) / base, night.runs, tuple(night.steps),
                   split, left)  # type: ignore[arg-type]


def counts(o: Outcome) -> dict[str, int]:
    """Proposals by kind, and the tags: re-tests, combinations, revisits, ≥ 1σ gains lost."""
    out = {k: sum(s.kind == k for s in o.steps) for k in KINDS}
    out["retest"] = sum(s.move == "retest" for s in o.steps)
    out["combine"] = sum(s.move == "combine" for s in o.steps)
    out["revisit"] = sum(s.revisit for s in o.steps)
    out["discarded-gain>=1sd"] = sum(s.kind == "discarded-gain" and s.gain >= NOISE
                                     for s in o.steps)
    return out


COLUMNS = ("oom", "nan", "dead", "kept-helped", "kept-no-help", "discarded-gain",
           "discarded-gain>=1sd", "discarded", "retest", "combine", "revisit", "none")


def breakdown(outs: list[Outcome], proposals: int, per_problem: bool = False) -> str:
    """A table of where the regret goes: a row per problem (optional) and the aggregate."""
    head = ["problem", "closed", "never tried", "tried, not kept", "kept, then lost",
            "runs/proposal"] + list(COLUMNS)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def row(name: str, group: list[Outcome], agg: bool) -> str:
        parts = [statistics.fmean(o.split[i] for o in group) for i in range(3)]
        closed = (statistics.median(o.closed for o in group) if agg else group[0].closed)
        runs = sum(o.runs for o in group) / (len(group) * proposals)
        n = [counts(o) for o in group]
        total = sum(n[0][k] for k in KINDS) * len(group)
        cells = [name, f"{closed:.3f}"] + [f"{p:.3f}" for p in parts] + [f"{runs:.2f}"]
        for c in COLUMNS:
            v = sum(x[c] for x in n)
            cells.append(f"{v / total:.1%}" if agg else str(v))
        return "| " + " | ".join(cells) + " |"

    if per_problem:
        lines += [row(str(i), [o], False) for i, o in enumerate(outs)]
    lines.append(row(f"all {len(outs)} (median closed; mean splits; share of proposals)",
                     outs, True))
    lines += ["", "one-knob gains left at the end, by why (mean, share of the baseline's regret): "
              + "; ".join(f"{why} {statistics.fmean(o.knobs[why] for o in outs):.3f}"
                          for why in KNOB_WHY)]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=24)
    ap.add_argument("--seed", type=int, default=None, help="default: a fresh random seed")
    ap.add_argument("--proposals", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--family", choices=sorted(FAMILIES), default=None,
                    help="a held-out family of search_families instead of generated problems")
    ap.add_argument("--per-problem", action="store_true", help="a breakdown row per problem")
    ap.add_argument("--oracle", choices=ORACLES, default=None,
                    help="what the search is given: the knobs that do nothing, runs without noise")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    jobs = [(seed, i, args.proposals, args.family, args.oracle) for i in range(args.problems)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        out = list(pool.map(one, jobs))
    shares = [o.closed for o in out]
    q = statistics.quantiles(shares, n=4)
    runs = sum(o.runs for o in out) / len(out) / args.proposals
    what = f"nights of {args.family}" if args.family else "problems drawn"
    what += f" (oracle: {args.oracle})" if args.oracle else ""
    print(f"{args.problems} {what} with seed {seed}, {args.proposals} proposals each: "
          f"median closed share {statistics.median(shares):.3f} (quartiles {q[0]:.3f}, "
          f"{q[2]:.3f}); runs per proposal {runs:.2f}")
    print("closed shares: " + " ".join(f"{s:.2f}" for s in shares))
    print()
    print(breakdown(out, args.proposals, args.per_problem))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
