"""The loop's vocabulary: statuses, crash classes, plain dataclasses and allowed transitions.

Pure: the stdlib and agent.core.config (the typed target rules) only. Nothing here touches
git, processes, SQL or HTTP.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agent.core.config import Direction, TargetConfig


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


class CrashKind(str, enum.Enum):
    TRIVIAL = "trivial"  # the idea may be fine, the code is wrong: fix and retry
    FUNDAMENTAL = "fundamental"  # OOM, NaN, divergence, crash mid-training: log and move on
    TIMEOUT = "timeout"  # killed at the hard limit


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

    @property
    def delta(self) -> float | None:
        if self.metric is None or self.best_before is None:
            return None
        return self.metric - self.best_before


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


@dataclass(frozen=True)
class Finish:
    """Everything recorded when an experiment reaches a finished status."""

    status: ExperimentStatus
    crash_kind: CrashKind | None = None
    reason: str | None = None
    metric: float | None = None
    best_before: float | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    log_tail: str | None = None
    run_started_at: datetime | None = None
    run_ended_at: datetime | None = None
    warnings: tuple[str, ...] = ()  # contract problems (budget ignored or overshot), kept in meta
