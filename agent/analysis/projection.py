"""One experiment as every interface shows it: REST, the MCP tools and `results --format json`.

`ExperimentView.of(experiment, sweep_name)` is the only serialization of an experiment: the API's
`ExperimentPublic` is this model, the MCP tools list it and extend it (a waited-for result), and
`overnight results --format json` prints it beside each experiment's evidence. A new field on
an experiment is added here once and appears everywhere.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from agent.core.domain import Experiment


def memory_gb(exp: Experiment) -> float:
    """Peak memory in GB (one decimal) from the summary's peak_memory_mb or peak_vram_mb."""
    mb = exp.summary.get("peak_memory_mb", exp.summary.get("peak_vram_mb"))
    if not isinstance(mb, int | float) or not math.isfinite(mb):
        return 0.0
    return round(mb / 1024, 1)


def _round(value: float | None) -> float | None:
    """Deltas without float noise (-0.19999999999999996 → -0.2)."""
    return None if value is None else round(value, 9)


class ExperimentView(BaseModel):
    id: int
    sweep: str
    status: str
    crash_kind: str | None
    crash_cause: str | None = Field(description="the fine cause of a crash, e.g. \"CUDA out of "
                                    "memory\", as classification named it")
    description: str
    diff: str | None = Field(None, description="only when one experiment is asked for")
    metric: float | None = Field(description="the mean of the runs the decision rests on")
    delta: float | None = Field(description="metric - best_before")
    best_before: float | None
    commit: str | None
    ref: str | None
    parent_id: int | None
    attempt: int
    is_baseline: bool
    priority: int
    proposer: str
    reason: str | None
    summary: dict[str, Any]
    memory_gb: float
    training_seconds: float | None
    warnings: list[str] = Field(description="contract problems of its run (budget ignored …)")
    meta: dict[str, Any]
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    log_path: str | None

    @classmethod
    def fields_of(cls, e: Experiment, sweep_name: str, with_diff: bool = False
                  ) -> dict[str, Any]:
        """The projection's values, for models that extend it."""
        seconds = e.summary.get("training_seconds")
        return dict(
            id=e.id, sweep=sweep_name, status=e.status.value,
            crash_kind=e.crash_kind.value if e.crash_kind else None, crash_cause=e.crash_cause,
            description=e.description,
            diff=e.diff if with_diff else None, metric=e.metric, delta=_round(e.delta),
            best_before=e.best_before, commit=e.commit, ref=e.ref, parent_id=e.parent_id,
            attempt=e.attempt, is_baseline=e.is_baseline, priority=e.priority,
            proposer=e.proposer, reason=e.reason, summary=e.summary, memory_gb=memory_gb(e),
            training_seconds=float(seconds) if isinstance(seconds, int | float) else None,
            warnings=[str(w) for w in e.meta.get("warnings", [])], meta=e.meta,
            created_at=e.created_at, started_at=e.started_at, finished_at=e.finished_at,
            log_path=e.log_path,
        )

    @classmethod
    def of(cls, e: Experiment, sweep_name: str, with_diff: bool = False) -> ExperimentView:
        return cls(**cls.fields_of(e, sweep_name, with_diff))
