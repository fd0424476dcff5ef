"""The keep rule's plain data: its settings (Rule), what it looks at (Evidence), what it says
(Verdict), and the two answers every rule shares (run again; re-queue on a moved head).

Pure: the stdlib, the domain, config, classify's CrashFacts and the blocking Sample only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from agent.core.config import Direction, TargetConfig
from agent.core.domain import CrashKind, ExperimentStatus
from agent.rules.classify import CrashFacts
from agent.rules.conditions import Sample
from agent.rules.noise import speed_tolerance

SEQUENTIAL, STRICT = "sequential", "strict"
# how a discard's reason starts when the change was judged on its runs and was not better (the
# comparison itself, which a person reads in the evidence's columns); any other discard's reason
# says what went wrong (a failed or stopped run, a machine that would not hold still)
NOT_BETTER, NOT_CLEARLY_BETTER = "not better", "not clearly better"


def judged_not_better(reason: str | None) -> bool:
    """Whether a reason is the keep rule's plain "not better" verdict."""
    return (reason or "").startswith((NOT_BETTER, NOT_CLEARLY_BETTER))


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
    # futility (sequential): the discard bar rises from discard_z after the first run towards
    # keep_z at max_runs by this share (0: flat), so a change whose repeats cannot plausibly
    # reach the keep bar stops getting runs (agent.rules.sequential); the runs it saves pay
    # for the incumbent's fresh run after a keep (agent.rules.decide.incumbent_due)
    futility: float = 0.5
    # not target keys: the parts of the rule benchmarks/keep_rule.py --ablate turns off one by
    # one (docs/keep-rule.md). A keep resting on runs in other machine conditions needs z this
    # much above keep_z (fresh references there carry no winner's curse, so repeated looks
    # cost more); the incumbent runs again after a keep on its own 2 runs
    # (agent.rules.decide.incumbent_due); a first run faster than the incumbent's latest runs
    # and worse than them is discarded without a run beside it (agent.rules.sequential)
    fresh_z: float = 0.45
    rerun_after_keep: bool = True
    faster_worse: bool = True

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
            futility=config.futility,
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
    notes: tuple[str, ...] = ()  # per run of `runs`: how it was placed (agent.blocking)
    best_suspect: tuple[bool, ...] = ()  # per run of `best`: off its usual condition
    best_notes: tuple[str, ...] = ()  # per run of `best`
    incumbent: bool = False  # the next run is the incumbent's, beside run `pair_of`
    pair_of: int | None = None


def again(ev: Evidence, rule: Rule, base: Verdict) -> Verdict:
    """Run once more, unless another slot moved the head: then re-queue there first."""
    if ev.head_moved and not ev.is_baseline:
        return stale(ev, base)
    return replace(base, status=None, seed=rule.seed + len(ev.runs))


def stale(ev: Evidence, base: Verdict) -> Verdict:
    why = (
        f"promising, but conflicts with the change kept meanwhile: {ev.conflict}"
        if ev.conflict
        else "promising, but the branch moved while it ran; re-queued on the new head"
    )
    return replace(base, status=ExperimentStatus.DISCARDED, reason=why, requeue=not ev.conflict)


def tolerance(ev: Evidence, rule: Rule) -> float:
    """The share a run's throughput may be off its condition's: the target's
    `throughput_tolerance`, else measured from the sweep's back-to-back runs."""
    if rule.throughput_tolerance is not None:
        return rule.throughput_tolerance
    return speed_tolerance(ev.speed_noise)


