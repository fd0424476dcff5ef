"""`overnight gc`'s queries: find old finished experiments, and prune a batch of them in one
transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy import delete, insert, select, update

from agent.core.domain import Experiment, ExperimentStatus, utcnow
from agent.core.errors import ConflictError, NotFoundError
from agent.core.ports import Pruned
from db.models import ExperimentRow, LossPointRow, RunRow
from db.rows import loss_rows, to_experiment
from db.session import StoreBase


class Pruning(StoreBase):
    def prunable_experiments(self, finished_before: datetime,
                             statuses: Sequence[ExperimentStatus], limit: int,
                             after_id: int = 0) -> list[Experiment]:
        finished = [s.value for s in statuses if s.is_finished()]
        q = (select(ExperimentRow)
             .where(ExperimentRow.status.in_(finished),
                    ExperimentRow.finished_at < finished_before,
                    ExperimentRow.pruned_at.is_(None), ExperimentRow.id > after_id)
             .order_by(ExperimentRow.id).limit(limit))
        with self.session("finding experiments to prune") as s:
            return [to_experiment(r) for r in s.scalars(q)]

    def prune_experiments(self, pruned: Mapping[int, Pruned]) -> None:
        if not pruned:
            return
        ids = sorted(pruned)
        with self.session("pruning experiments") as s:
            rows = {r.id: r for r in s.scalars(
                select(ExperimentRow).where(ExperimentRow.id.in_(ids)))}
            for exp_id in ids:
                row = rows.get(exp_id)
                if row is None:
                    raise NotFoundError(f"no experiment with id {exp_id}")
                if not ExperimentStatus(row.status).is_finished():
                    raise ConflictError(f"experiment {exp_id} is {row.status}: only "
                                        "finished experiments are pruned")
            s.execute(delete(LossPointRow).where(LossPointRow.experiment_id.in_(ids)))
            kept = [p for exp_id in ids for p in loss_rows(exp_id, pruned[exp_id][0])]
            if kept:
                s.execute(insert(LossPointRow), kept)
            s.execute(update(RunRow).where(RunRow.experiment_id.in_(ids)).values(log_path=None))
            now = utcnow()
            for exp_id in ids:
                row = rows[exp_id]
                row.log_path, row.pruned_at = None, now
                row.meta = {**(row.meta or {}), "pruned": dict(pruned[exp_id][1])}
