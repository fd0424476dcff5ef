"""Keep, discard, or run again: the loop's decision after each run, as one pure function.

`decide(evidence, rule) -> Verdict`. Pure: imports only the stdlib, the domain, classify,
config and noise; the loop gathers the evidence (runs from the store, git's head) and carries
out the verdict. Two rules:

- ``sequential`` (default): σ̂ is the pooled within-commit standard deviation of the sweep's
  repeated runs (or `noise_sigma`); z = gain / (σ̂·√(1/n_change + 1/n_best)). After each run:
  discard when z < discard_z; from the second run on keep when z ≥ keep_z; discard after
  max_runs; otherwise run again. Nothing is kept before σ̂ has two degrees of freedom.
- ``strict``: autoresearch's rule — one run, strictly better than the best by > min_delta
  (with `confirm_runs`, a would-be keep is re-run and judged on the mean).

Run k of any commit uses seed `seed + k`, so challenger and incumbent are compared seed for seed.
A run whose throughput says it measured the machine (see noise.suspect_flags) is not decided on:
the commit runs again (with the next seed, so σ̂ still sees seed-to-seed noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from agent.core.config import TargetConfig
from agent.core.domain import CrashKind, Direction, ExperimentStatus
from agent.rules.blocking import (
    Blocks,
    Sample,
    arrange,
    conditions,
    incumbent_notes,
    usual_keys,
)
from agent.rules.classify import CrashFacts, classify
from agent.rules.estimate import Noise, estimate, gain_only, noise
from agent.rules.noise import identical, mean, p_better, pooled_sigma, speed_tolerance

SEQUENTIAL, STRICT = "sequential", "strict"
MIN_INCUMBENT_RUNS = 2  # a decision rests on at least this many incumbent runs per condition
KEEP_INCUMBENT_RUNS = 3  # and a keep on this many (the baseline's runs)
MAX_SUSPECT_RERUNS = 1  # one extra run for runs that measured the machine (then: decide or stop)
FRESH_Z = 0.0
MAX_UNUSABLE = 1  # a change's runs left out (the machine moved around them) beyond max_runs


def is_improvement(
    metric: float | None,
    best: float | None,
    direction: Direction,
    min_delta: float = 0.0,
) -> bool:
    """True when `metric` beats `best` by more than `min_delta` (strictly better at 0).

    A missing or non-finite metric never wins; with no best yet, any finite metric does.
    """
    if metric is None or not math.isfinite(metric):
        return False
    if best is None or not math.isfinite(best):
        return True
    if direction is Direction.MINIMIZE:
        return metric < best - min_delta
    return metric > best + min_delta


@dataclass(frozen=True)
class Rule:
    """The decision's settings (from overnight.toml and the sweep)."""

    direction: Direction = Direction.MINIMIZE
    decision: str = SEQUENTIAL
    min_delta: float = 0.0
    seed: int = 42
    discard_z: float = 0.6
    keep_z: float = 1.75
    max_runs: int = 4
    baseline_runs: int = 3
    noise_sigma: float | None = None
    incumbent_every: int = 8
    throughput_tolerance: float | None = None  # None: SPEED_Z measured run-to-run σ
    confirm_runs: int = 0  # strict only: extra runs of a would-be keep and of the baseline

    @classmethod
    def of(cls, config: TargetConfig) -> Rule:
        return cls(
            direction=Direction(config.direction),
            decision=config.decision,
            min_delta=config.min_delta,
            seed=config.seed,
            discard_z=config.discard_z,
            keep_z=config.keep_z,
            max_runs=config.max_runs,
            baseline_runs=config.baseline_runs,
            noise_sigma=config.noise_sigma,
            incumbent_every=config.incumbent_every,
            throughput_tolerance=config.throughput_tolerance,
            confirm_runs=config.confirm_runs,
        )

    @property
    def sequential(self) -> bool:
        return self.decision == SEQUENTIAL


@dataclass(frozen=True)
class RunFailure:
    """The latest run ended without a usable metric (or was stopped, or cheated)."""

    stopped: bool = False
    incumbent: bool = False  # the incumbent's run beside the change failed, not the change's
    tampered: tuple[str, ...] = ()
    facts: CrashFacts | None = None
    error: str = ""  # one line: why, for later runs


@dataclass(frozen=True)
class Evidence:
    """Everything the decision looks at, gathered by the loop."""

    is_baseline: bool
    runs: tuple[Sample, ...]  # this experiment's good runs, oldest first
    best: tuple[Sample, ...] = ()  # the good runs of the commit it was built on
    others: tuple[float, int] = (0.0, 0)  # noise.squares() of the sweep's other commits
    failed: RunFailure | None = None  # the latest run, when it produced no metric
    speed_noise: float | None = None  # run-to-run σ of log throughput (noise.speed_noise)
    head_moved: bool = False  # another slot kept a change since this one started
    conflict: str | None = None  # git's message when the diff no longer applies there


@dataclass(frozen=True)
class Verdict:
    status: ExperimentStatus | None  # None: not finished, run again
    reason: str = ""
    crash_kind: CrashKind | None = None
    keep: bool = False
    seed: int | None = None  # the seed of the next run when running again
    requeue: bool = False  # measured on a stale head: queue the same diff on the new head
    repair: bool = False  # a trivial crash: ask the proposer for a fix
    metric: float | None = None  # the mean of the runs the decision rests on
    n: int = 0
    z: float | None = None
    p_better: float | None = None
    sigma: float | None = None
    suspect: tuple[bool, ...] = field(default_factory=tuple)  # per run of `runs`
    notes: tuple[str, ...] = ()  # per run of `runs`: how it was placed (agent.blocking)
    best_suspect: tuple[bool, ...] = ()  # per run of `best`: off its usual condition
    best_notes: tuple[str, ...] = ()  # per run of `best`
    incumbent: bool = False  # the next run is the incumbent's, beside run `pair_of`
    pair_of: int | None = None

    @property
    def run_again(self) -> bool:
        return self.status is None


def decide(ev: Evidence, rule: Rule) -> Verdict:
    """The verdict after the latest run of an experiment."""
    if ev.failed is not None:
        return _failure(ev, rule)
    if not rule.sequential:
        base = Verdict(
            None,
            metric=mean([r.metric for r in ev.runs]),
            n=len(ev.runs),
            suspect=(False,) * len(ev.runs),
        )
        return _strict(ev, rule, base)
    if ev.is_baseline:
        return _baseline(ev, rule)
    return _sequential(ev, rule)


def _failure(ev: Evidence, rule: Rule) -> Verdict:
    f = ev.failed
    assert f is not None
    if f.stopped:
        k = len(ev.runs)
        why = "cancelled while running"
        if k:
            why = f"cancelled during a confirmation run (run {k + 1})"
        return Verdict(ExperimentStatus.CANCELLED, why)
    if f.tampered:
        why = f"the run modified protected file(s): {', '.join(f.tampered)}"
        return Verdict(ExperimentStatus.CRASHED, why, CrashKind.FUNDAMENTAL)
    k = len(ev.runs)
    if f.incumbent:
        why = (f"the incumbent's run beside it failed ({f.error}): no comparison in the same "
               "conditions")
        return Verdict(ExperimentStatus.DISCARDED, why, metric=mean([r.metric for r in ev.runs]),
                       n=k)
    if k == 0 and f.facts is not None:  # the first run: classify the crash
        crash = classify(f.facts)
        status = (
            ExperimentStatus.TIMEOUT
            if crash.kind is CrashKind.TIMEOUT
            else ExperimentStatus.CRASHED
        )
        return Verdict(status, crash.reason, crash.kind, repair=crash.kind is CrashKind.TRIVIAL)
    why = f"run {k + 1} (seed {rule.seed + k}) failed: {f.error}"
    metric = mean([r.metric for r in ev.runs])
    if ev.is_baseline:
        return Verdict(ExperimentStatus.CRASHED, why, CrashKind.FUNDAMENTAL, metric=metric, n=k)
    return Verdict(ExperimentStatus.DISCARDED, why, metric=metric, n=k)


def _again(ev: Evidence, rule: Rule, base: Verdict) -> Verdict:
    """Run once more, unless another slot moved the head: then re-queue there first."""
    if ev.head_moved and not ev.is_baseline:
        return _stale(ev, base)
    return replace(base, status=None, seed=rule.seed + len(ev.runs))


def _stale(ev: Evidence, base: Verdict) -> Verdict:
    why = (
        f"promising, but conflicts with the change kept meanwhile: {ev.conflict}"
        if ev.conflict
        else "promising, but the branch moved while it ran; re-queued on the new head"
    )
    return replace(base, status=ExperimentStatus.DISCARDED, reason=why, requeue=not ev.conflict)


def _baseline(ev: Evidence, rule: Rule) -> Verdict:
    """The baseline's runs grouped by the machine's conditions; the first best is the mean of
    its usual condition (the most runs), once that holds two runs or the runs are done."""
    if not rule.sequential:
        values = [r.metric for r in ev.runs]
        n, want = len(values), 1 + rule.confirm_runs
        if n < want:
            return Verdict(None, seed=rule.seed + n, metric=mean(values), n=n,
                           suspect=(False,) * n)
        why = f"baseline: the mean of {n} run{'s' if n > 1 else ''}"
        return Verdict(ExperimentStatus.KEPT, why, keep=True, metric=mean(values), n=n,
                       suspect=(False,) * n)
    keys = conditions(ev.runs, tolerance(ev, rule))
    usual = usual_keys(keys)
    flags = tuple(k != usual.get(k[0]) for k in keys)
    clean = [r.metric for r, off in zip(ev.runs, flags, strict=True) if not off]
    n, want = len(ev.runs), rule.baseline_runs
    base = Verdict(None, metric=mean(clean), n=len(clean), suspect=flags,
                   notes=tuple(incumbent_notes(ev.runs, keys)))
    if n >= want and len(clean) >= min(2, want):
        why = f"baseline: the mean of {len(clean)} run{'s' if len(clean) > 1 else ''}"
        if len(clean) < n:
            why += f" at its usual speed ({n - len(clean)} more at another: the machine)"
        return replace(base, status=ExperimentStatus.KEPT, reason=why, keep=True)
    if n >= want + MAX_SUSPECT_RERUNS:  # a busy machine: go on, but say so
        values = [r.metric for r in ev.runs]
        why = (
            f"baseline: the mean of all {n} runs; their throughput swung by more "
            f"than {tolerance(ev, rule):.0%} (is the machine busy?)"
        )
        return replace(base, status=ExperimentStatus.KEPT, reason=why, keep=True,
                       metric=mean(values), n=n, suspect=(False,) * n)
    return replace(base, seed=rule.seed + n)  # run k: seed + k


def _noise(ev: Evidence, rule: Rule, blocks: Blocks) -> Noise:
    """σ̂ from the runs back to back (and the sweep's other commits), and the drift the
    incumbent's runs spread over the night show (agent.rules.estimate)."""
    if rule.noise_sigma is not None:
        return Noise(rule.noise_sigma, 1_000_000)
    return noise(blocks.back_to_back, blocks.spread, prior=ev.others)


def _z(gain: float, se: float) -> float:
    """gain / its standard error; ±inf when that is 0, 0 at 0 (noise.z_score's convention)."""
    if se > 0:
        return gain / se
    return 0.0 if gain == 0 else math.copysign(math.inf, gain)


def _pending(ev: Evidence, rule: Rule, blocks: Blocks, base: Verdict) -> Verdict:
    """The latest run has no incumbent run in its conditions: run the incumbent beside it
    (same seed), or stop when the machine will not hold still."""
    assert blocks.pending is not None
    if ev.head_moved:
        return _stale(ev, base)
    run = ev.runs[blocks.pending]
    if _beside(ev) >= rule.max_runs or len(ev.runs) >= rule.max_runs + MAX_UNUSABLE:
        why = "discarded: the machine's speed kept changing around its runs (is it busy?)"
        return replace(base, status=ExperimentStatus.DISCARDED, reason=why)
    seed = run.seed if run.seed is not None else rule.seed + blocks.pending
    if seed in {b.seed for b in ev.best}:  # a seed run twice measures its luck twice
        seed = fresh_seed(ev, rule)
    why = blocks.notes[blocks.pending] or "no incumbent run in its conditions yet"
    return replace(base, status=None, incumbent=True, pair_of=run.run_id or None, seed=seed,
                   reason=why)


def _beside_latest(ev: Evidence, rule: Rule, base: Verdict, why: str) -> Verdict:
    """Run the incumbent once more beside the change's latest run, with a seed it has not
    run (a seed run twice measures its luck twice)."""
    last = ev.runs[-1]
    seed = fresh_seed(ev, rule)
    return replace(base, incumbent=True, pair_of=last.run_id or None, seed=seed, reason=why)


def fresh_seed(ev: Evidence, rule: Rule) -> int:
    """The smallest seed from `rule.seed` on that the incumbent has not run."""
    used = {b.seed for b in ev.best}
    seed = rule.seed
    while seed in used:
        seed += 1
    return seed


def _beside(ev: Evidence) -> int:
    """How many incumbent runs were started beside this change's runs."""
    mine = {r.run_id for r in ev.runs if r.run_id}
    return sum(1 for b in ev.best if b.pair_of in mine)


def _sequential(ev: Evidence, rule: Rule) -> Verdict:
    sign = 1.0 if rule.direction is Direction.MINIMIZE else -1.0
    blocks = arrange(ev.runs, ev.best, tolerance(ev, rule))
    base = Verdict(None, n=blocks.n, suspect=blocks.suspect, notes=blocks.notes,
                   best_suspect=blocks.best_suspect, best_notes=blocks.best_notes)
    if not ev.best:  # nothing to compare with (no baseline runs): cannot keep
        why = "no incumbent runs to compare with"
        return replace(base, status=ExperimentStatus.DISCARDED, reason=why)
    if blocks.pending is not None:
        return _pending(ev, rule, blocks, base)
    n = _noise(ev, rule, blocks)
    sigma, df = n.sigma, n.df
    got = estimate(blocks.strata, n, sign)
    plain = gain_only(blocks.strata, sign)
    if plain is None:  # its runs straddled changes of the machine: none is comparable yet
        if len(ev.runs) >= rule.max_runs + MAX_UNUSABLE or ev.head_moved:
            why = "discarded: the machine's speed kept changing around its runs (is it busy?)"
            return replace(base, status=ExperimentStatus.DISCARDED, reason=why)
        return _again(ev, rule, base)
    gain, se = got if got is not None else (plain, None)
    usual = mean(list(blocks.usual)) or 0.0
    runs_used = blocks.n
    metric = usual - sign * gain  # the change's mean in the incumbent's usual conditions
    z = p = None
    if se is not None:
        z, p = _z(gain - rule.min_delta, se), p_better(_z(gain, se))
    base = replace(base, metric=metric, z=z, p_better=p, sigma=sigma)
    text = _describe(metric, usual, runs_used, z, p, sigma) + _placed(blocks, n)
    fewest = min(len(s.incumbent(sigma)) for s in blocks.strata)
    if fewest < MIN_INCUMBENT_RUNS and _beside(ev) < rule.max_runs and not ev.head_moved:
        return _beside_latest(ev, rule, base, "one incumbent run in these conditions is a weak "
                              "reference: the incumbent runs again beside it")
    if (z is not None and z < rule.discard_z) or (z is None and gain - rule.min_delta <= 0):
        return replace(base, status=ExperimentStatus.DISCARDED, reason=f"not better: {text}")
    other = any(blocks.suspect) and FRESH_Z  # compared in other machine conditions
    if z is not None and df >= 2 and runs_used >= 2 and z >= rule.keep_z + other:
        if ev.head_moved:
            return _stale(ev, base)
        if blocks.unconfirmed and len(ev.runs) < rule.max_runs + MAX_UNUSABLE:
            return _again(ev, rule, base)  # its own speed, if its next run keeps it
        if fewest < KEEP_INCUMBENT_RUNS and _beside(ev) < rule.max_runs:
            why = (f"would be kept ({text}), but on {fewest} incumbent runs in these "
                   "conditions: the incumbent runs again beside it first")
            return _beside_latest(ev, rule, base, why)
        return replace(base, status=ExperimentStatus.KEPT, reason=f"better: {text}", keep=True)
    if runs_used >= rule.max_runs or len(ev.runs) >= rule.max_runs + MAX_UNUSABLE:
        why = f"not clearly better after {runs_used} runs: {text}"
        if df < 2:
            why = f"not kept: the noise is not measured yet ({df} degree(s) of freedom"
            if identical([*blocks.back_to_back, *blocks.spread]):
                why += "; its repeats are identical: does the script ignore OVERNIGHT_SEED?"
            why += f"); {text}"
        return replace(base, status=ExperimentStatus.DISCARDED, reason=why)
    return _again(ev, rule, base)


def _placed(blocks: Blocks, n: Noise) -> str:
    """How the comparison was blocked, when it was more than the plain one."""
    beside = sorted({i for s in blocks.strata for i in s.beside_ids})
    shifted = sum(blocks.suspect)
    if not beside and not shifted and n.drift is None:
        return ""
    parts = []
    if beside:
        parts.append("beside incumbent run" + ("s " if len(beside) > 1 else " ")
                     + ", ".join(map(str, beside)))
    if shifted:
        parts.append(f"{shifted} run{'s' if shifted > 1 else ''} in other machine conditions"
                     " compared in those conditions")
    if n.drift is not None:
        parts.append(f"the incumbent's runs spread over the night drift: σ {n.drift:.3g}")
    return f"; same-conditions comparison ({'; '.join(parts)}), in the incumbent's usual terms"


def _describe(
    m: float, best: float, n: int, z: float | None, p: float | None, sigma: float | None
) -> str:
    text = f"mean {m:.6g} of {n} run{'s' if n > 1 else ''} vs best {best:.6g}"
    if z is None or p is None or sigma is None:
        return text + " (noise unknown)"
    return f"{text}, σ̂ {sigma:.3g}, z {z:.2f}, P(better) {p:.2f}"


def _strict(ev: Evidence, rule: Rule, base: Verdict) -> Verdict:
    """autoresearch's rule, with the optional confirmation runs judged on their mean."""
    values = [r.metric for r in ev.runs]
    n, m = len(values), base.metric
    assert m is not None
    if ev.is_baseline:
        return _baseline(ev, rule)
    best = mean([b.metric for b in ev.best])
    text = f"{m:.6g}" + (f" (mean of {n} runs)" if n > 1 else "") + f" vs best {best}"
    judged = n == 1 or n >= 1 + rule.confirm_runs  # today's rule: first run, then the mean
    if judged and not is_improvement(m, best, rule.direction, rule.min_delta):
        why = f"not better (strict): {text}"
        return replace(base, status=ExperimentStatus.DISCARDED, reason=why)
    if n < 1 + rule.confirm_runs:
        return _again(ev, rule, base)
    if ev.head_moved:
        return _stale(ev, base)
    return replace(base, status=ExperimentStatus.KEPT, reason=f"better (strict): {text}", keep=True)


def tolerance(ev: Evidence, rule: Rule) -> float:
    """The share a run's throughput may be off its condition's: the target's
    `throughput_tolerance`, else measured from the sweep's back-to-back runs."""
    if rule.throughput_tolerance is not None:
        return rule.throughput_tolerance
    return speed_tolerance(ev.speed_noise)


def incumbent_due(decided: int, incumbent_runs: int, rule: Rule) -> bool:
    """Re-run the incumbent once every `incumbent_every` decided proposals (sequential only)."""
    if not rule.sequential or rule.incumbent_every <= 0:
        return False
    return decided // rule.incumbent_every > incumbent_runs


BUDGET_OVERSHOOT = 0.05  # training may run this share over the budget
BUDGET_UNDERSHOOT = 0.5  # a script that stops before this share of the budget ignores it


def contract_warnings(summary: dict[str, float | str], budget_s: float) -> list[str]:
    """Problems with the script contract that make runs incomparable (none = an empty list)."""
    seconds = summary.get("training_seconds")
    if not isinstance(seconds, int | float) or not math.isfinite(seconds):
        if not summary:
            return []
        return ["the summary has no training_seconds: the budget cannot be checked"]
    if seconds > budget_s * (1 + BUDGET_OVERSHOOT):
        over = seconds / budget_s - 1
        return [
            f"trained {seconds:g} s for a {budget_s:g} s budget ({over:.0%} over): "
            "runs are not comparable; does the script stop at OVERNIGHT_BUDGET_S?"
        ]
    if seconds < budget_s * BUDGET_UNDERSHOOT:
        return [
            f"trained {seconds:g} s of a {budget_s:g} s budget: does the script read "
            "OVERNIGHT_BUDGET_S?"
        ]
    return []
