"""SQLAlchemy 2.0 typed models. The schema's history lives in db/migrations (Alembic)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[datetime]):
    """Stores aware UTC datetimes; SQLite drops tzinfo, so put it back on the way out."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given; use agent.core.domain.utcnow()")
        return value.replace(tzinfo=None) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        from datetime import UTC

        return value.replace(tzinfo=UTC) if value is not None else None


class JsonText(TypeDecorator[Any]):
    """JSON as text through Python's json module, so NaN and Infinity (a diverged run's
    summary) round-trip; PostgreSQL's json type refuses them. SQLite's JSON is the same text."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        return None if value is None else json.dumps(value)

    def process_result_value(self, value: str | None, dialect: Any) -> Any:
        return None if value is None else json.loads(value)


# The JSON columns: SQLAlchemy's JSON on SQLite (as the migrations made them), text on PostgreSQL.
JSON_TYPE = JSON().with_variant(JsonText(), "postgresql")
# Ids, references and token sums: 64-bit like SQLite's INTEGER (BIGSERIAL ids on PostgreSQL).
BIG = Integer().with_variant(BigInteger(), "postgresql")
ACTIVE_DIFF = text("status IN ('queued', 'running') AND diff_key IS NOT NULL")


class Base(DeclarativeBase):
    pass


class SweepRow(Base):
    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(BIG, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    target_path: Mapped[str] = mapped_column(Text)
    branch: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(20), index=True)
    proposer: Mapped[str] = mapped_column(String(100))
    config: Mapped[dict[str, Any]] = mapped_column(JSON_TYPE)
    protected_hashes: Mapped[dict[str, str]] = mapped_column(JSON_TYPE, default=dict)
    max_experiments: Mapped[int | None] = mapped_column(Integer)
    deadline: Mapped[datetime | None] = mapped_column(UTCDateTime)
    start_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    window: Mapped[dict[str, str] | None] = mapped_column(JSON_TYPE)
    baseline_metric: Mapped[float | None] = mapped_column(Float)
    best_metric: Mapped[float | None] = mapped_column(Float)
    best_commit: Mapped[str | None] = mapped_column(String(64))
    best_experiment_id: Mapped[int | None] = mapped_column(BIG)
    llm_tokens_in: Mapped[int] = mapped_column(BIG, default=0)
    llm_tokens_out: Mapped[int] = mapped_column(BIG, default=0)
    llm_usd: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


CRASHED_ROWS = "crash_kind IS NOT NULL"
HAS_PARENT = "parent_id IS NOT NULL"


class ExperimentRow(Base):
    __tablename__ = "experiments"
    __table_args__ = (
        Index("ix_experiments_queue", "status", "priority", "id"),
        Index("ix_experiments_sweep_id", "sweep_id", "id"),
        # Keyset pages (newest first, `id < cursor`) for every filter the API and dashboard
        # offer (migration keyset_pages): each is an equality prefix then `id`, so a page
        # reads its own rows only, however big the table.
        Index("ix_experiments_status_id", "status", "id"),
        Index("ix_experiments_sweep_status", "sweep_id", "status", "id"),
        Index("ix_experiments_crash", "crash_kind", "id",
              sqlite_where=text(CRASHED_ROWS), postgresql_where=text(CRASHED_ROWS)),
        Index("ix_experiments_sweep_crash", "sweep_id", "crash_kind", "id",
              sqlite_where=text(CRASHED_ROWS), postgresql_where=text(CRASHED_ROWS)),
        Index("ix_experiments_sweep_diff", "sweep_id", "diff_key"),  # the duplicate check
        # An experiment page's "retried as" links (migration experiment_parent_index).
        Index("ix_experiments_parent", "parent_id", "id", sqlite_where=text(HAS_PARENT),
              postgresql_where=text(HAS_PARENT)),
        # The time filter's id range: one seek for each end (db/keyset.py, migration
        # created_index); the pages themselves walk the (…, id) indexes above.
        Index("ix_experiments_created", "created_at", "id"),
        # One queued/running row per change and sweep: the duplicate check is the insert
        # itself (migration active_diff_unique).
        Index("ux_experiments_active_diff", "sweep_id", "diff_key", unique=True,
              sqlite_where=ACTIVE_DIFF, postgresql_where=ACTIVE_DIFF),
    )

    id: Mapped[int] = mapped_column(BIG, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(BIG, ForeignKey("sweeps.id", ondelete="CASCADE"))
    parent_id: Mapped[int | None] = mapped_column(BIG, ForeignKey("experiments.id"))
    retry_of: Mapped[int | None] = mapped_column(
        BIG, ForeignKey("experiments.id", name="fk_experiments_retry_of"), unique=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    is_baseline: Mapped[bool] = mapped_column(Boolean, default=False)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    proposer: Mapped[str] = mapped_column(String(100))
    description: Mapped[str] = mapped_column(Text)
    diff: Mapped[str] = mapped_column(Text)
    diff_key: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(20))
    crash_kind: Mapped[str | None] = mapped_column(String(20))
    crash_cause: Mapped[str | None] = mapped_column(String(100))
    cancel_reason: Mapped[str | None] = mapped_column(Text)  # a requested cancel (not yet done)
    reason: Mapped[str | None] = mapped_column(Text)
    base_commit: Mapped[str | None] = mapped_column(String(64))
    commit: Mapped[str | None] = mapped_column(String(64))
    ref: Mapped[str | None] = mapped_column(String(300))
    metric: Mapped[float | None] = mapped_column(Float)
    best_before: Mapped[float | None] = mapped_column(Float)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON_TYPE, default=dict)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON_TYPE, default=dict)
    log_path: Mapped[str | None] = mapped_column(Text)
    log_tail: Mapped[str | None] = mapped_column(Text)
    pgid: Mapped[int | None] = mapped_column(Integer)
    llm_tokens_in: Mapped[int] = mapped_column(BIG, default=0)
    llm_tokens_out: Mapped[int] = mapped_column(BIG, default=0)
    llm_usd: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    run_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    run_ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    pruned_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # by `overnight gc`


class ExperimentCountRow(Base):
    """How many experiments a sweep has per status and crash kind ("" for none), and their run
    seconds: changed in the same transaction as every insert, status change and finish
    (db/counts.py), so a page's total is a sum over a few rows instead of a COUNT over the
    table."""

    __tablename__ = "experiment_counts"

    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"),
                                          primary_key=True)
    status: Mapped[str] = mapped_column(String(20), primary_key=True)
    crash_kind: Mapped[str] = mapped_column(String(20), primary_key=True)
    n: Mapped[int] = mapped_column(Integer)
    # Seconds from run start to run end summed over those rows (migration counts_run_seconds):
    # the overview's GPU-hours without reading the experiments.
    run_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")


class LossPointRow(Base):
    __tablename__ = "loss_points"
    __table_args__ = (Index("ix_loss_points_experiment", "experiment_id", "step"),)

    id: Mapped[int] = mapped_column(BIG, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(BIG, ForeignKey("experiments.id",
                                                                ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    loss: Mapped[float] = mapped_column(Float)
    elapsed_s: Mapped[float | None] = mapped_column(Float)


class RunRow(Base):
    """One execution of a commit's script (baseline, screen, confirm or incumbent run)."""

    __tablename__ = "runs"
    __table_args__ = (
        Index("ix_runs_sweep", "sweep_id", "id"),
        Index("ix_runs_experiment", "experiment_id", "id"),
        Index("ix_runs_status", "status"),
        # The highest id per sweep and status (Store.sweep_version) is one seek (run_counts).
        Index("ix_runs_sweep_status", "sweep_id", "status", "id"),
    )

    id: Mapped[int] = mapped_column(BIG, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(BIG, ForeignKey("sweeps.id", ondelete="CASCADE"))
    experiment_id: Mapped[int] = mapped_column(BIG, ForeignKey("experiments.id",
                                                                ondelete="CASCADE"))
    commit: Mapped[str] = mapped_column(String(64))
    seed: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(20))
    status: Mapped[str] = mapped_column(String(20))
    metric: Mapped[float | None] = mapped_column(Float)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON_TYPE, default=dict)
    throughput: Mapped[float | None] = mapped_column(Float)
    throughput_unit: Mapped[str | None] = mapped_column(String(20))
    training_s: Mapped[float | None] = mapped_column(Float)
    total_s: Mapped[float | None] = mapped_column(Float)
    pgid: Mapped[int | None] = mapped_column(Integer)
    log_path: Mapped[str | None] = mapped_column(Text)
    device: Mapped[str | None] = mapped_column(String(100))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Where the throughput came from, the change's run an incumbent run ran beside, and how
    # the keep rule placed the run (migration run_blocking).
    throughput_source: Mapped[str | None] = mapped_column(String(40))
    pair_run_id: Mapped[int | None] = mapped_column(BIG)
    note: Mapped[str | None] = mapped_column(String(500))
    # The run's loss by fraction of the budget, [[fraction, loss, step], ...] (a few hundred
    # points at most; migration run_pruning): the early-stop rule's incumbent curves.
    curve: Mapped[list[list[float]] | None] = mapped_column(JSON_TYPE)
    # The sealed holdout metric, never in the summary (migration holdout_confirm).
    holdout: Mapped[float | None] = mapped_column(Float)
    # The Slurm job that ran it, executor 'slurm' (migration run_slurm_job).
    slurm_job_id: Mapped[str | None] = mapped_column(String(64))
    # A pruned run: the share of its budget at which the early stop ended it (migration
    # run_stop_fraction).
    stop_fraction: Mapped[float | None] = mapped_column(Float)


class RunCountRow(Base):
    """How many runs a sweep has per status: changed in the same transaction as every run
    start, end and verdict flip (db/counts.py bump_runs), so Store.sweep_version reads a few
    rows instead of counting the sweep's runs (migration run_counts)."""

    __tablename__ = "run_counts"

    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"),
                                          primary_key=True)
    status: Mapped[str] = mapped_column(String(20), primary_key=True)
    n: Mapped[int] = mapped_column(Integer)


class TrackSweepRow(Base):
    """A sweep as an experiment tracker holds it (agent.ops.track's ledger): its parent
    run, whether it was ended, and the error the last sync stopped on (migration
    track_marks)."""

    __tablename__ = "track_sweeps"

    sweep_id: Mapped[int] = mapped_column(BIG, ForeignKey("sweeps.id", ondelete="CASCADE"),
                                          primary_key=True)
    destination: Mapped[str] = mapped_column(String(300), primary_key=True)
    remote_id: Mapped[str | None] = mapped_column(String(200))
    closed: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str | None] = mapped_column(Text)
    failing_since: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class TrackExperimentRow(Base):
    """An experiment as a tracker holds it: its child run and the verdict it was sent."""

    __tablename__ = "track_experiments"

    sweep_id: Mapped[int] = mapped_column(BIG, ForeignKey("sweeps.id", ondelete="CASCADE"),
                                          primary_key=True)
    destination: Mapped[str] = mapped_column(String(300), primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        BIG, ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    remote_id: Mapped[str] = mapped_column(String(200))
    sent: Mapped[dict[str, float]] = mapped_column(JSON_TYPE, default=dict)
    mirrored_at: Mapped[datetime] = mapped_column(UTCDateTime)
