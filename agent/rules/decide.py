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

from agent.core.config import Direction, TargetConfig
from agent.core.domain import CrashKind, ExperimentStatus
from agent.rules.classify import CrashFacts, classify
from agent.rules.noise import mean, p_better, pooled_sigma, suspect_flags, z_score

SEQUENTIAL, STRICT = "sequential", "strict"
MAX_SUSPECT_RERUNS = 1  # one extra run for runs that measured the machine (then: decide or stop)


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
    throughput_tolerance: float = 0.15
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
class Sample:
    """One finished run with a finite metric."""

    metric: float
    throughput: float | None = None


@dataclass(frozen=True)
class RunFailure:
    """The latest run ended without a usable metric (or was stopped, or cheated)."""

    stopped: bool = False
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
    head_moved: bool = False  # another slot kept a change since this one started
    conflict: str | None = None  # git's message when the diff no longer applies there


@dataclass(frozen=True)
class Verdict:
    status: ExperimentStatus | None  # None: not finished, run again
    reason: str = ""
    crash_kind: CrashKind | None = None
    crash_cause: str | None = None  # classify's fine cause of a crash
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
    flags = tuple(
        suspect_flags(
            [r.throughput for r in ev.runs],
            [b.throughput for b in ev.best],
            rule.throughput_tolerance,
        )
    )
    clean = tuple(r.metric for r, s in zip(ev.runs, flags, strict=True) if not s)
    base = Verdict(None, metric=mean(clean), n=len(clean), suspect=flags)
    if ev.is_baseline:
        return _baseline(ev, rule, clean, base)
    return _sequential(ev, rule, clean, base)


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
    if k == 0 and f.facts is not None:  # the first run: classify the crash
        crash = classify(f.facts)
        status = (
            ExperimentStatus.TIMEOUT
            if crash.kind is CrashKind.TIMEOUT
            else ExperimentStatus.CRASHED
        )
        return Verdict(status, crash.reason, crash.kind, crash_cause=crash.cause or None,
                       repair=crash.kind is CrashKind.TRIVIAL)
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


def _baseline(ev: Evidence, rule: Rule, clean: tuple[float, ...], base: Verdict) -> Verdict:
    n = len(clean)
    want = rule.baseline_runs if rule.sequential else 1 + rule.confirm_runs
    if n >= want:
        why = f"baseline: the mean of {n} run{'s' if n > 1 else ''}"
        return replace(base, status=ExperimentStatus.KEPT, reason=why, keep=True)
    if len(ev.runs) >= want + MAX_SUSPECT_RERUNS:  # a busy machine: go on, but say so
        values = [r.metric for r in ev.runs]
        why = (
            f"baseline: the mean of all {len(values)} runs; their throughput swung by more "
            f"than {rule.throughput_tolerance:.0%} (is the machine busy?)"
        )
        return replace(
            base,
            status=ExperimentStatus.KEPT,
            reason=why,
            keep=True,
            metric=mean(values),
            n=len(values),
            suspect=(False,) * len(values),
        )
    return replace(base, seed=rule.seed + len(ev.runs))  # run k: seed + k


def _gain(change: float, best: float, rule: Rule) -> float:
    """How much better the change is than the best, net of min_delta (positive = better)."""
    raw = best - change if rule.direction is Direction.MINIMIZE else change - best
    return raw - rule.min_delta


def _noise(
    ev: Evidence, rule: Rule, best: list[float], clean: tuple[float, ...]
) -> tuple[float | None, int]:
    if rule.noise_sigma is not None:
        return rule.noise_sigma, 1_000_000
    return pooled_sigma([best, clean], prior=ev.others)


def _sequential(ev: Evidence, rule: Rule, clean: tuple[float, ...], base: Verdict) -> Verdict:
    n, best = len(clean), [b.metric for b in ev.best]
    capped = len(ev.runs) >= rule.max_runs + MAX_SUSPECT_RERUNS
    if (base.suspect and base.suspect[-1]) or n == 0:  # never decide on a machine measurement
        if capped:
            why = "discarded: its runs' throughput kept swinging (is the machine busy?)"
            return replace(base, status=ExperimentStatus.DISCARDED, reason=why)
        return _again(ev, rule, base)
    m, best_mean = base.metric, mean(best)
    assert m is not None
    if best_mean is None:  # nothing to compare with (no baseline runs): cannot keep
        why = "no incumbent runs to compare with"
        return replace(base, status=ExperimentStatus.DISCARDED, reason=why)
    sigma, df = _noise(ev, rule, best, clean)
    gain, z, p = _gain(m, best_mean, rule), None, None
    if sigma is not None:
        z = z_score(gain, sigma, n, len(best))
        p = p_better(z_score(gain + rule.min_delta, sigma, n, len(best)))
    base = replace(base, z=z, p_better=p, sigma=sigma)
    text = _describe(m, best_mean, n, z, p, sigma)
    if (z is not None and z < rule.discard_z) or (z is None and gain <= 0):
        return replace(base, status=ExperimentStatus.DISCARDED, reason=f"not better: {text}")
    if z is not None and df >= 2 and n >= 2 and z >= rule.keep_z:
        if ev.head_moved:
            return _stale(ev, base)
        return replace(base, status=ExperimentStatus.KEPT, reason=f"better: {text}", keep=True)
    if n >= rule.max_runs or capped:
        why = f"not clearly better after {n} runs: {text}"
        if df < 2:
            why = f"not kept: the noise is not measured yet ({df} degree(s) of freedom); {text}"
        return replace(base, status=ExperimentStatus.DISCARDED, reason=why)
    return _again(ev, rule, base)


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
        return _baseline(ev, rule, tuple(values), base)
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
