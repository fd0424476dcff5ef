"""Row ↔ domain conversions shared by the SqlStore's parts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields
from datetime import UTC
from functools import lru_cache
from typing import Any

from sqlalchemy import Row

from agent.core.config import TargetConfig
from agent.core.domain import (
    CrashKind,
    CurvePoints,
    Experiment,
    ExperimentStatus,
    Run,
    RunRole,
    RunStatus,
    Sweep,
    SweepStatus,
)
from db.models import ExperimentRow, RunRow, SweepRow
from runner.summary import ProgressPoint

# Experiment fields the dashboard's pages need; log_tail, meta and pgid are left out.
BRIEF_FIELDS = (
    "id", "sweep_id", "status", "description", "diff", "proposer", "parent_id", "retry_of",
    "attempt", "is_baseline", "crash_kind", "reason", "metric", "best_before", "summary",
    "log_path", "commit", "base_commit", "ref", "created_at", "started_at", "finished_at",
    "run_started_at", "run_ended_at",
)  # fmt: skip


def utc(value: Any) -> Any:
    """A naive UTC datetime read past UTCDateTime, made aware (None stays None)."""
    return value.replace(tzinfo=UTC) if value is not None else None


@lru_cache(maxsize=1024)
def _config(text: str) -> TargetConfig:
    return TargetConfig.from_dict(json.loads(text))


def sweep_config(raw: dict[str, Any]) -> TargetConfig:
    """A sweep row's config, validated once per distinct config (TargetConfig is frozen, so
    sweeps with the same config share one): listing a year of nights is not a year of
    validations."""
    return _config(json.dumps(raw, sort_keys=True))


def to_sweep(row: SweepRow) -> Sweep:
    return Sweep(
        id=row.id,
        name=row.name,
        target_path=row.target_path,
        branch=row.branch,
        status=SweepStatus(row.status),
        proposer=row.proposer,
        config=sweep_config(row.config),
        max_experiments=row.max_experiments,
        baseline_metric=row.baseline_metric,
        best_metric=row.best_metric,
        best_commit=row.best_commit,
        best_experiment_id=row.best_experiment_id,
        created_at=row.created_at,
        deadline=row.deadline,
        window=row.window,
        start_at=row.start_at,
        llm_spend=(row.llm_tokens_in, row.llm_tokens_out, row.llm_usd),
    )


# Experiment fields read from their column as they are (the others are converted below).
AS_STORED = tuple(f.name for f in fields(Experiment)
                  if f.name not in {"status", "crash_kind", "summary", "meta"})


def to_experiment(row: ExperimentRow) -> Experiment:
    return Experiment(
        status=ExperimentStatus(row.status),
        crash_kind=CrashKind(row.crash_kind) if row.crash_kind else None,
        summary=dict(row.summary or {}),
        meta=dict(row.meta or {}),
        **{name: getattr(row, name) for name in AS_STORED},
    )


def to_run(row: RunRow | Row[Any]) -> Run:
    """A run record from its ORM row or a plain row of the runs table's columns (list_runs
    reads those: a sweep's thousands of runs without building an ORM object each)."""
    return Run(
        id=row.id,
        sweep_id=row.sweep_id,
        experiment_id=row.experiment_id,
        commit=row.commit,
        seed=row.seed,
        role=RunRole(row.role),
        status=RunStatus(row.status),
        metric=row.metric,
        summary=dict(row.summary or {}),
        throughput=row.throughput,
        throughput_unit=row.throughput_unit,
        training_s=row.training_s,
        total_s=row.total_s,
        pgid=row.pgid,
        log_path=row.log_path,
        device=row.device,
        started_at=row.started_at,
        ended_at=row.ended_at,
        throughput_source=row.throughput_source,
        pair_run_id=row.pair_run_id,
        note=row.note,
        curve=curve_of(row.curve),
        holdout=row.holdout,
        slurm_job_id=row.slurm_job_id,
        stop_fraction=row.stop_fraction,
    )


def curve_of(raw: Any) -> CurvePoints | None:
    """A run's stored curve as (fraction, loss, step) points; None when it has none (or it is
    not a list of three numbers each)."""
    if not isinstance(raw, list) or not raw:
        return None
    try:
        return tuple((float(f), float(loss), float(step)) for f, loss, step in raw)
    except (TypeError, ValueError):
        return None


def loss_rows(experiment_id: int, points: Sequence[ProgressPoint]) -> list[dict[str, Any]]:
    """Plain rows for one bulk INSERT (the ORM's per-object path is ~50x slower here)."""
    return [{"experiment_id": experiment_id, "step": p.step, "loss": p.loss,
             "elapsed_s": p.elapsed_s} for p in points]
