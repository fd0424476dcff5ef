"""An experiment page's reads (neighbours, retries, run number), counts and run times."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, func, select, type_coerce

from agent.core.domain import RAN_STATUSES, CrashKind, Experiment, ExperimentStatus
from db import counts
from db.models import ExperimentRow, LossPointRow, UTCDateTime
from db.reads.base import ReadsBase
from db.rows import BRIEF_FIELDS, utc
from runner.summary import ProgressPoint

# Timestamps read as plain DateTime (UTCDateTime's per-value hook was half the read) and made
# aware again in the loop that builds the records.
BRIEF_TIMES = [f for f in BRIEF_FIELDS if isinstance(getattr(ExperimentRow, f).type, UTCDateTime)]
BRIEF_COLUMNS = [type_coerce(getattr(ExperimentRow, f), DateTime) if f in BRIEF_TIMES
                 else getattr(ExperimentRow, f) for f in BRIEF_FIELDS]


def _briefs(rows: Iterable[Sequence[Any]]) -> list[Experiment]:
    """Experiments from result rows of BRIEF_COLUMNS."""
    out = []
    for row in rows:
        d = dict(zip(BRIEF_FIELDS, row, strict=True))
        for f in BRIEF_TIMES:
            d[f] = utc(d[f])
        d["status"] = ExperimentStatus(d["status"])
        d["crash_kind"] = CrashKind(d["crash_kind"]) if d["crash_kind"] else None
        d["summary"] = dict(d["summary"] or {})
        out.append(Experiment(**d))
    return out


class ExperimentViews(ReadsBase):
    def adjacent_experiments(self, sweep_id: int, experiment_id: int
                             ) -> tuple[Experiment | None, Experiment | None]:
        """The brief rows just before and just after an id in its sweep (two index seeks)."""
        E = ExperimentRow
        q = select(*BRIEF_COLUMNS).where(E.sweep_id == sweep_id).limit(1)
        with self.session("reading neighbouring experiments") as s:
            before = _briefs(s.execute(q.where(E.id < experiment_id).order_by(E.id.desc())))
            after = _briefs(s.execute(q.where(E.id > experiment_id).order_by(E.id)))
        return (before[0] if before else None), (after[0] if after else None)

    def retries_of(self, experiment_id: int) -> list[Experiment]:
        """Brief rows of the experiments whose parent it is, oldest first (index on parent)."""
        q = (select(*BRIEF_COLUMNS).where(ExperimentRow.parent_id == experiment_id)
             .order_by(ExperimentRow.id))
        with self.session("listing retries") as s:
            return _briefs(s.execute(q))

    def run_number(self, sweep_id: int, experiment_id: int) -> int:
        """How many of the sweep's experiments up to this id have used a run (kept, discarded,
        crashed, timeout): a count over the (sweep, status, id) index, no rows read."""
        E = ExperimentRow
        q = select(func.count()).select_from(E).where(
            E.sweep_id == sweep_id, E.status.in_([st.value for st in RAN_STATUSES]),
            E.id <= experiment_id)
        with self.session("numbering a run") as s:
            return int(s.scalar(q) or 0)

    def run_seconds(self) -> dict[int, float]:
        """Per sweep, the seconds from run start to run end summed over its experiments whose
        run has ended: from the maintained counts (a few rows per sweep)."""
        with self.session("summing run times") as s:
            return {sid: total for sid, total in counts.run_seconds(s).items()}

    def status_counts_by_sweep(self) -> dict[int, dict[str, int]]:
        """Experiments per sweep and status (statuses with none left out), from the counts."""
        with self.session("counting experiments") as s:
            return counts.by_sweep(s)

    def timestamps(self, sweep_id: int) -> list[tuple[datetime | None, datetime | None]]:
        q = (
            select(ExperimentRow.run_started_at, ExperimentRow.run_ended_at)
            .where(ExperimentRow.sweep_id == sweep_id)
            .order_by(ExperimentRow.id)
        )
        with self.session("reading run times") as s:
            return [(a, b) for a, b in s.execute(q)]

    def status_counts(self, sweep_id: int | None = None) -> dict[str, int]:
        """Experiments per status, of one sweep or the whole database (maintained counts)."""
        with self.session("counting experiments") as s:
            return counts.by_status(s, sweep_id)

    def loss_points(self, experiment_id: int) -> list[ProgressPoint]:
        q = (
            select(LossPointRow)
            .where(LossPointRow.experiment_id == experiment_id)
            .order_by(LossPointRow.step, LossPointRow.id)
        )
        with self.session("reading loss points") as s:
            return [ProgressPoint(r.step, r.loss, r.elapsed_s) for r in s.scalars(q)]
