"""Loss curves: bulk insert, replace and read of an experiment's progress points."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from sqlalchemy import delete, insert, select

from db.models import LossPointRow
from db.rows import loss_rows
from db.session import StoreBase
from runner.summary import ProgressPoint


class LossCurves(StoreBase):
    # --- loss curve ---------------------------------------------------------------------
    def add_loss_points(self, experiment_id: int, points: Sequence[ProgressPoint]) -> None:
        if not points:
            return
        with self.session("recording loss points") as s:
            s.execute(insert(LossPointRow), loss_rows(experiment_id, points))

    def replace_loss_points(self, experiment_id: int, points: Sequence[ProgressPoint]) -> None:
        with self.session("recording loss points") as s:
            s.execute(delete(LossPointRow).where(LossPointRow.experiment_id == experiment_id))
            if points:
                s.execute(insert(LossPointRow), loss_rows(experiment_id, points))

    def loss_curves(self, experiment_ids: Collection[int]) -> dict[int, list[ProgressPoint]]:
        out: dict[int, list[ProgressPoint]] = {i: [] for i in experiment_ids}
        if not out:
            return out
        t = LossPointRow.__table__.c
        q = (select(t.experiment_id, t.step, t.loss, t.elapsed_s)
             .where(t.experiment_id.in_(list(out)))
             .order_by(t.experiment_id, t.step, t.id))
        with self.session("reading loss curves") as s:
            for exp_id, step, loss, elapsed in s.execute(q):
                out[exp_id].append(ProgressPoint(step, loss, elapsed))
        return out
