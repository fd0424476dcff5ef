"""The trackers' ledger (agent.ops.track.TrackLedger) on the database: what MLflow or W&B
holds of each sweep: the parent run, each experiment's child run with the verdict it was sent,
and the error the last sync stopped on.

Its own tables (track_sweeps, track_experiments), beside the Store rather than on its port:
only the mirror writes them; the pages read them through db.reads (`track_progress`).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from agent.core.domain import utcnow
from agent.ops.track import Mirrored, TrackLedger
from db.models import TrackExperimentRow, TrackSweepRow
from db.session import StoreBase

TS, TE = TrackSweepRow, TrackExperimentRow


class TrackMarks(StoreBase):
    # --- the ledger (the mirror's thread, `overnight export`) ------------------------------
    def mirrored(self, sweep_id: int, destination: str) -> Mirrored:
        with self.session("reading what a tracker holds") as s:
            row = s.get(TS, (sweep_id, destination))
            exps = s.execute(select(TE.experiment_id, TE.remote_id, TE.sent).where(
                TE.sweep_id == sweep_id, TE.destination == destination)).all()
        return Mirrored(parent=row.remote_id if row else None,
                        closed=bool(row.closed) if row else False,
                        experiments={e: (r, dict(sent or {})) for e, r, sent in exps})

    def follow(self, sweep_id: int, destination: str) -> None:
        with self.session("recording a tracker's sweep") as s:
            self._sweep_row(s, sweep_id, destination)

    def mark_sweep(self, sweep_id: int, destination: str, remote_id: str,
                   closed: bool) -> None:
        with self.session("recording a tracker's sweep run") as s:
            row = self._sweep_row(s, sweep_id, destination)
            row.remote_id, row.closed, row.error, row.failing_since = remote_id, closed, None, None
            row.updated_at = utcnow()

    def mark_experiment(self, sweep_id: int, destination: str, experiment_id: int,
                        remote_id: str, sent: dict[str, float]) -> None:
        with self.session("recording a tracker's experiment run") as s:
            row = s.get(TE, (sweep_id, destination, experiment_id))
            if row is None:
                row = TE(sweep_id=sweep_id, destination=destination,
                         experiment_id=experiment_id)
                s.add(row)
            row.remote_id, row.sent, row.mirrored_at = remote_id, dict(sent), utcnow()
            parent = self._sweep_row(s, sweep_id, destination)
            parent.error, parent.failing_since, parent.updated_at = None, None, utcnow()

    def failed(self, sweep_id: int, destination: str, error: str) -> None:
        with self.session("recording a tracker's failure") as s:
            row = self._sweep_row(s, sweep_id, destination)
            now = utcnow()
            row.error, row.failing_since = error[:2000], row.failing_since or now
            row.updated_at = now

    @staticmethod
    def _sweep_row(s: Session, sweep_id: int, destination: str) -> TrackSweepRow:
        row = s.get(TS, (sweep_id, destination))
        if row is None:
            row = TS(sweep_id=sweep_id, destination=destination, remote_id=None, closed=False,
                     updated_at=utcnow())
            s.add(row)
        return row


def _implements_the_port(marks: TrackMarks) -> TrackLedger:
    """mypy checks here that TrackMarks is the mirror's ledger."""
    return marks
