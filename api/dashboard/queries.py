"""Lean reads for the dashboard: a sweep's experiments without their log tails and metadata.

A sweep page lists every experiment of a sweep (for the plot); loading each row's log tail
(kilobytes each) would dominate the page time at 1,000 experiments. On the SQL store this
selects only the columns the pages use; any other Store falls back to list_experiments.
"""

from __future__ import annotations

from typing import Any

from agent.domain import CrashKind, Experiment, ExperimentStatus

# Experiment fields the sweep page needs; log_tail, meta and pgid are left out.
BRIEF_FIELDS = (
    "id", "sweep_id", "status", "description", "diff", "proposer", "parent_id", "attempt",
    "is_baseline", "crash_kind", "reason", "metric", "best_before", "summary", "log_path",
    "commit", "ref", "created_at", "started_at", "finished_at", "run_started_at",
    "run_ended_at",
)  # fmt: skip


def list_brief(store: Any, sweep_id: int) -> list[Experiment]:
    """The sweep's experiments, oldest first, with `log_tail` None and `meta` empty."""
    if not hasattr(store, "session"):
        return list(store.list_experiments(sweep_id))
    from sqlalchemy import select

    from db.models import ExperimentRow

    q = (
        select(*(getattr(ExperimentRow, f) for f in BRIEF_FIELDS))
        .where(ExperimentRow.sweep_id == sweep_id)
        .order_by(ExperimentRow.id)
    )
    out = []
    with store.session("listing a sweep for the dashboard") as s:
        for row in s.execute(q):
            d = dict(zip(BRIEF_FIELDS, row, strict=True))
            d["status"] = ExperimentStatus(d["status"])
            d["crash_kind"] = CrashKind(d["crash_kind"]) if d["crash_kind"] else None
            d["summary"] = dict(d["summary"] or {})
            out.append(Experiment(**d))
    return out
