"""How far behind each experiment tracker is on a sweep (the mirror's ledger, db.track_marks),
for the dashboard's sweep page and `overnight status`.

A tracker is behind by the finished experiments it has not been sent: read off the maintained
counts (experiment_counts) and the ledger's rows, not a scan of the experiments.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select

from agent.core.domain import FINISHED_STATUSES
from db.models import ExperimentCountRow, TrackExperimentRow, TrackSweepRow
from db.reads.base import ReadsBase

TS, TE = TrackSweepRow, TrackExperimentRow
FINISHED = sorted(s.value for s in FINISHED_STATUSES)


@dataclass(frozen=True)
class TrackProgress:
    """One tracker's hold on one sweep."""

    destination: str
    mirrored: int  # experiments it holds
    behind: int  # finished experiments it does not hold yet
    closed: bool  # the sweep's run was ended (its final numbers sent)
    error: str | None  # what the last sync stopped on (None: it went through)
    failing_since: datetime | None
    updated_at: datetime

    @property
    def up_to_date(self) -> bool:
        return self.behind == 0 and self.error is None

    def line(self) -> str:
        """One line for a page or a terminal."""
        if self.up_to_date:
            return f"{self.destination}: up to date ({self.mirrored} experiments)"
        why = f"; last error: {self.error}" if self.error else ""
        return (f"{self.destination}: behind by {self.behind} experiment(s), "
                f"{self.mirrored} mirrored{why}")


class TrackViews(ReadsBase):
    def track_progress(self, sweep_id: int) -> list[TrackProgress]:
        """Each tracker that holds (or tried to hold) the sweep, with how far behind it is."""
        with self.session("reading the trackers' progress") as s:
            rows = s.execute(select(TS).where(TS.sweep_id == sweep_id)
                             .order_by(TS.destination)).scalars().all()
            if not rows:
                return []
            held = {d: int(n) for d, n in s.execute(
                select(TE.destination, func.count()).where(TE.sweep_id == sweep_id)
                .group_by(TE.destination)).all()}
            finished = int(s.execute(
                select(func.coalesce(func.sum(ExperimentCountRow.n), 0))
                .where(ExperimentCountRow.sweep_id == sweep_id,
                       ExperimentCountRow.status.in_(FINISHED))).scalar_one())
        return [TrackProgress(r.destination, held.get(r.destination, 0),
                              max(0, finished - held.get(r.destination, 0)), bool(r.closed),
                              r.error, r.failing_since, r.updated_at) for r in rows]
