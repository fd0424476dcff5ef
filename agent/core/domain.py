"""The loop's vocabulary: statuses, crash classes, plain dataclasses and allowed transitions.

Pure: the stdlib, agent.core.config (the typed target rules) and agent.core.errors only. Nothing
here touches git, processes, SQL or HTTP. The record's invariants (a finished experiment is
read-only, the lifecycle's transitions, a keep needs a metric) are checked here, once, by every
store (`check_started`, `check_finish`).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any

from agent.core.config import Direction, TargetConfig
from agent.core.errors import ConflictError
from agent.core.record import RECORD_KEY, StopPoint, VerdictRecord


def utcnow() -> datetime:
    """The one clock helper: timezone-aware UTC."""
    return datetime.now(UTC)


def as_utc(when: datetime) -> datetime:
    """`when` as aware UTC; a naive one is read as UTC already (the service's own times are)."""
    if when.tzinfo is None:
        return when.replace(tzinfo=UTC)
    try:
        return when.astimezone(UTC)
    except OverflowError:  # an offset past year 1 or 9999: the edge of time is the answer
        return (datetime.min if when.year == 1 else datetime.max).replace(tzinfo=UTC)


class ExperimentStatus(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    KEPT = "kept"
    DISCARDED = "discarded"
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"

    def is_finished(self) -> bool:
        return self not in (ExperimentStatus.QUEUED, ExperimentStatus.RUNNING)


FINISHED_STATUSES = frozenset(s for s in ExperimentStatus if s.is_finished())

# Which status may follow which. Finished records are read-only: they have no successors.
ALLOWED_TRANSITIONS: dict[ExperimentStatus, frozenset[ExperimentStatus]] = {
    ExperimentStatus.QUEUED: frozenset(
        {ExperimentStatus.RUNNING, ExperimentStatus.CANCELLED, ExperimentStatus.REJECTED}
    ),
    ExperimentStatus.RUNNING: frozenset(
        {
            ExperimentStatus.KEPT,
            ExperimentStatus.DISCARDED,
            ExperimentStatus.CRASHED,
            ExperimentStatus.TIMEOUT,
            ExperimentStatus.REJECTED,
            ExperimentStatus.CANCELLED,
            ExperimentStatus.INTERRUPTED,
        }
    ),
    **{s: frozenset() for s in FINISHED_STATUSES},
}


# An experiment that ran to a verdict (each one is a run of the sweep's progress plot and count).
RAN_STATUSES = (
    ExperimentStatus.KEPT,
    ExperimentStatus.DISCARDED,
    ExperimentStatus.CRASHED,
    ExperimentStatus.TIMEOUT,
)

# What uses up one of a sweep's max_experiments: a run (or a refusal) the proposal caused. Queued
# ones do not yet; cancelled and interrupted runs are the service's doing, not the proposal's.
# The priority of a queued experiment that continues one already counted (a change re-queued
# on a new head, a repair of a trivial crash): ahead of new proposals, and run even once the
# sweep has reached max_experiments.
CONTINUATION_PRIORITY = 50

USED_STATUSES = (
    ExperimentStatus.RUNNING,
    ExperimentStatus.KEPT,
    ExperimentStatus.DISCARDED,
    ExperimentStatus.CRASHED,
    ExperimentStatus.TIMEOUT,
    ExperimentStatus.REJECTED,
)


def can_transition(old: ExperimentStatus, new: ExperimentStatus) -> bool:
    return new in ALLOWED_TRANSITIONS[old]


INTERRUPTED_REASON = "the service stopped while this experiment was running"


def reaped_end(cancel_reason: str | None) -> tuple[ExperimentStatus, str]:
    """How a `running` experiment left by a dead process ends: interrupted (and re-queued),
    or cancelled when its cancel had been requested (a 202 is a promise)."""
    if cancel_reason is not None:
        return ExperimentStatus.CANCELLED, f"{cancel_reason} (recorded when the service restarted)"
    return ExperimentStatus.INTERRUPTED, INTERRUPTED_REASON


# What a run's start may record on its experiment (Store.mark_started).
MARK_STARTED_FIELDS = frozenset({"commit", "ref", "base_commit", "log_path", "pgid",
                                 "run_started_at"})


def check_started(experiment_id: int, current: ExperimentStatus, fields: Any) -> None:
    """May a run's start be recorded on this experiment? Raises ValueError for a field that
    is not a run start's, ConflictError when the experiment is finished (read-only)."""
    bad = set(fields) - MARK_STARTED_FIELDS
    if bad:
        raise ValueError(f"mark_started: unknown field(s) {sorted(bad)}")
    if current.is_finished():
        raise ConflictError(f"experiment {experiment_id} is finished ({current.value})")


def check_finish(experiment_id: int, current: ExperimentStatus, finish: Finish,
                 keeps: bool) -> None:
    """May `finish` be recorded on an experiment that is `current` (with `keeps`: as the
    sweep's new best)? Raises ValueError for a caller's mistake (a status that is not
    finished, a keep without a metric) and ConflictError when the record forbids it (already
    finished: finished is read-only; or a transition the lifecycle does not allow)."""
    if not finish.status.is_finished():
        raise ValueError(f"finish needs a finished status, got {finish.status.value}")
    if keeps and finish.best is None:
        raise ValueError("keep_commit needs the new best's value (Finish.best)")
    if current.is_finished():
        raise ConflictError(f"experiment {experiment_id} is already {current.value}")
    if not can_transition(current, finish.status):
        raise ConflictError(f"experiment {experiment_id} is {current.value}; it cannot "
                            f"become {finish.status.value}")


class CrashKind(str, enum.Enum):
    TRIVIAL = "trivial"  # the idea may be fine, the code is wrong: fix and retry
    FUNDAMENTAL = "fundamental"  # OOM, NaN, divergence, crash mid-training: log and move on
    TIMEOUT = "timeout"  # killed at the hard limit
    # training finished, then its evaluation crashed (e.g. out of memory at eval time): a
    # target with an `eval_command` has the evaluation re-run from the saved checkpoint
    EVALUATION = "evaluation"


class SweepStatus(str, enum.Enum):
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"
    DONE = "done"

    def is_finished(self) -> bool:
        return self in (SweepStatus.STOPPED, SweepStatus.DONE)


@dataclass(frozen=True)
class Proposal:
    """One change: a one-line description and a unified diff against the sweep head."""

    description: str
    diff: str
    proposer: str = "external"
    parent_id: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sweep:
    id: int
    name: str
    target_path: str
    branch: str
    status: SweepStatus
    proposer: str
    config: TargetConfig
    max_experiments: int | None
    baseline_metric: float | None
    best_metric: float | None
    best_commit: str | None
    best_experiment_id: int | None
    created_at: datetime
    deadline: datetime | None = None
    window: dict[str, str] | None = None
    start_at: datetime | None = None  # a paused sweep's timed start
    # Language-model tokens in, out and dollars spent so far, as read with the sweep.
    llm_spend: tuple[int, int, float] = (0, 0, 0.0)

    @property
    def direction(self) -> Direction:
        return Direction(self.config.direction)

    @property
    def metric(self) -> str:
        return self.config.metric

    @property
    def budget_s(self) -> float:
        return self.config.budget_s

    @property
    def timeout_s(self) -> float:
        return self.config.timeout_s

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def min_delta(self) -> float:
        return self.config.min_delta


@dataclass(frozen=True)
class Experiment:
    id: int
    sweep_id: int
    status: ExperimentStatus
    description: str
    diff: str
    proposer: str
    parent_id: int | None = None
    retry_of: int | None = None  # the interrupted experiment this row re-runs
    attempt: int = 0
    is_baseline: bool = False
    priority: int = 0
    base_commit: str | None = None
    commit: str | None = None
    ref: str | None = None
    crash_kind: CrashKind | None = None
    crash_cause: str | None = None  # the fine cause classification named ("CUDA out of memory")
    reason: str | None = None
    metric: float | None = None
    best_before: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    log_path: str | None = None
    log_tail: str | None = None
    pgid: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    run_started_at: datetime | None = None
    run_ended_at: datetime | None = None
    pruned_at: datetime | None = None  # when `overnight gc` removed its log files

    @functools.cached_property
    def record(self) -> VerdictRecord | None:
        """Every number its verdict rested on (agent.core.record); None before it finished."""
        return VerdictRecord.of(self.meta)

    @property
    def delta(self) -> float | None:
        """Inferred: its difference from the incumbent runs it was compared with, within machine
        conditions, signed as the metric (change − incumbent); None when not compared."""
        return self.record.difference if self.record is not None else None


class RunRole(str, enum.Enum):
    BASELINE = "baseline"  # a run of the unmodified head that starts the sweep
    SCREEN = "screen"  # the first run of a change
    CONFIRM = "confirm"  # a later run of a change
    INCUMBENT = "incumbent"  # a re-measurement of the current best


class RunStatus(str, enum.Enum):
    RUNNING = "running"
    OK = "ok"  # a finite metric, decided on
    SUSPECT = "suspect"  # a metric, but its throughput says it measured the machine
    FAILED = "failed"  # no usable metric (crash, FAIL, NaN, tampering)
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"  # the service died while it ran
    # stopped early: its loss curve was clearly behind the incumbent's (agent.rules.prune);
    # finished, not a crash (not `pruned_at`, which is retention's removal of old logs)
    PRUNED = "pruned"


# A run's loss curve as recorded: (fraction of the training budget, loss, step) points.
CurvePoints = tuple[tuple[float, float, float], ...]


@dataclass(frozen=True)
class RunSpec:
    """What is known when a run starts."""

    sweep_id: int
    experiment_id: int
    commit: str
    seed: int
    role: RunRole
    log_path: str | None = None
    device: str | None = None
    pair_run_id: int | None = None  # an incumbent run started beside this run of a change


@dataclass(frozen=True)
class RunEnd:
    """What is recorded when a run ends."""

    status: RunStatus
    metric: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    throughput: float | None = None
    throughput_unit: str | None = None
    training_s: float | None = None
    total_s: float | None = None
    throughput_source: str | None = None  # agent.throughput: summary key, progress lines
    note: str | None = None  # a pruned run: why it was stopped (PruneCall.reason())
    curve: CurvePoints | None = None  # its loss by fraction of the budget (None: no lines)
    holdout: float | None = None  # the sealed holdout metric (TargetConfig.holdout_metric)
    stop_fraction: float | None = None  # pruned: the share of the budget its early stop read


@dataclass(frozen=True)
class Run:
    """One execution of a commit's training script: a first-class record."""

    id: int
    sweep_id: int
    experiment_id: int
    commit: str
    seed: int
    role: RunRole
    status: RunStatus
    metric: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    throughput: float | None = None
    throughput_unit: str | None = None
    training_s: float | None = None
    total_s: float | None = None
    pgid: int | None = None
    log_path: str | None = None
    device: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    throughput_source: str | None = None  # where the throughput came from; None: unknown
    pair_run_id: int | None = None  # an incumbent run: the change's run it ran beside
    note: str | None = None  # how the keep rule placed it (why it is suspect, its pair)
    curve: CurvePoints | None = None  # its loss by fraction of the budget (migration run_pruning)
    holdout: float | None = None  # the sealed holdout metric: for the report after the night
    slurm_job_id: str | None = None  # the Slurm job that ran it (executor 'slurm')
    stop_fraction: float | None = None  # pruned: the share of the budget its early stop read


@dataclass(frozen=True)
class Finish:
    """Everything recorded when an experiment reaches a finished status: made from the rule's
    verdict in one place (agent.rules.endings.finish_of)."""

    status: ExperimentStatus
    crash_kind: CrashKind | None = None
    reason: str | None = None
    metric: float | None = None  # measured: the mean of the runs its record names
    best_before: float | None = None  # the best at its verdict (its record's `best`)
    summary: dict[str, Any] = field(default_factory=dict)
    log_tail: str | None = None
    run_started_at: datetime | None = None
    run_ended_at: datetime | None = None
    warnings: tuple[str, ...] = ()  # contract problems (budget ignored or overshot), kept in meta
    crash_cause: str | None = None  # classification's fine cause, recorded once
    # every number its verdict rested on (agent.core.record), kept in meta["verdict"]
    record: VerdictRecord | None = None
    # a keep: the sweep's best from now on, its value as agent.engine.incumbent works it out
    best: float | None = None


# The fields of a Finish that every store records on the experiment as they are (the status,
# crash kind, summary, warnings and the run's start are written by each store's own rule).
FINISH_AS_IS = tuple(f.name for f in fields(Finish) if f.name not in {
    "status", "crash_kind", "summary", "warnings", "run_started_at", "record", "best"})


def born(sweep_id: int, proposal: Proposal, ended: Finish | None, now: datetime, *,
         is_baseline: bool = False, attempt: int = 0, priority: int = 0,
         base_commit: str | None = None, retry_of: int | None = None) -> Experiment:
    """A new experiment as every store inserts it: queued, or born finished with `ended`."""
    if ended is not None and not ended.status.is_finished():
        raise ValueError(f"a row born ended needs a finished status, got {ended.status.value}")
    exp = Experiment(
        id=0, sweep_id=sweep_id, status=ExperimentStatus.QUEUED,
        description=proposal.description, diff=proposal.diff, proposer=proposal.proposer,
        parent_id=proposal.parent_id, retry_of=retry_of, attempt=attempt,
        is_baseline=is_baseline, priority=priority, base_commit=base_commit,
        meta=dict(proposal.meta), summary={}, created_at=now)
    if ended is None:
        return exp
    return replace(exp, status=ended.status, crash_kind=ended.crash_kind, reason=ended.reason,
                   crash_cause=ended.crash_cause, metric=ended.metric,
                   best_before=ended.best_before, meta=finished_meta(exp.meta, ended),
                   finished_at=now)


def record_of(exp: Experiment) -> VerdictRecord | None:
    """An experiment's record (None: it ended before records, or has not ended)."""
    return VerdictRecord.of(exp.meta)


def stopped_at(meta: Mapping[str, Any] | None) -> StopPoint | None:
    """Where an early-stopped change was stopped; None if it was not."""
    record = VerdictRecord.of(meta)
    return record.stopped if record is not None else None


def finished_meta(meta: Mapping[str, Any] | None, finish: Finish) -> dict[str, Any]:
    """An experiment's meta once finished: with the contract warnings and its record (every
    store writes it so)."""
    out = dict(meta or {})
    if finish.warnings:
        out["warnings"] = list(finish.warnings)
    if finish.record is not None:
        out[RECORD_KEY] = finish.record.to_json()
    return out
