"""`overnight gc`'s queries: find old finished experiments, and prune one in a transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert, select, update

from agent.domain import Experiment, ExperimentStatus, utcnow
from agent.errors import ConflictError, NotFoundError
from db.models import ExperimentRow, LossPointRow, RunRow
from db.rows import loss_rows, to_experiment
from db.session import StoreBase
from runner.summary import ProgressPoint


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

    def prune_experiment(self, experiment_id: int, points: Sequence[ProgressPoint],
                         note: Mapping[str, Any]) -> Experiment:
        with self.session("pruning an experiment") as s:
            row = s.get(ExperimentRow, experiment_id)
            if row is None:
                raise NotFoundError(f"no experiment with id {experiment_id}")
            if not ExperimentStatus(row.status).is_finished():
                raise ConflictError(f"experiment {experiment_id} is {row.status}: only "
                                    "finished experiments are pruned")
            s.execute(delete(LossPointRow).where(LossPointRow.experiment_id == experiment_id))
            if points:
                s.execute(insert(LossPointRow), loss_rows(experiment_id, points))
            s.execute(update(RunRow).where(RunRow.experiment_id == experiment_id)
                      .values(log_path=None))
            row.log_path = None
            row.pruned_at = utcnow()
            row.meta = {**(row.meta or {}), "pruned": dict(note)}
            return to_experiment(row)
