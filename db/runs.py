"""Run records: one per execution of a commit (start, pgid, end, suspect flag, reaping), and the
loss curves the runs print: bulk insert, replace and read of an experiment's progress points."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from agent.core.domain import Run, RunEnd, RunSpec, RunStatus, utcnow
from agent.core.errors import ConflictError, NotFoundError
from db import counts
from db.models import ExperimentRow, LossPointRow, RunRow
from db.rows import loss_rows, to_run
from db.session import StoreBase
from runner.summary import ProgressPoint

NOTE_CHARS = 500


class RunQueries(StoreBase):
    # --- runs ---------------------------------------------------------------------------
    def start_run(self, spec: RunSpec) -> Run:
        """Record a run as `running` before its process starts."""
        row = RunRow(
            sweep_id=spec.sweep_id,
            experiment_id=spec.experiment_id,
            commit=spec.commit,
            seed=spec.seed,
            role=spec.role.value,
            status=RunStatus.RUNNING.value,
            summary={},
            log_path=spec.log_path,
            device=spec.device,
            pair_run_id=spec.pair_run_id,
            started_at=utcnow(),
        )
        with self.session("recording a run start") as s:
            if s.get(ExperimentRow, spec.experiment_id) is None:
                raise NotFoundError(f"no experiment with id {spec.experiment_id}")
            s.add(row)
            s.flush()
            counts.bump_runs(s, spec.sweep_id, None, row.status)
            return to_run(row)

    def _run_row(self, s: Session, run_id: int) -> RunRow:
        row = s.get(RunRow, run_id)
        if row is None:
            raise NotFoundError(f"no run with id {run_id}")
        return row

    def set_run_pgid(self, run_id: int, pgid: int) -> None:
        with self.session("recording a run's process group") as s:
            self._run_row(s, run_id).pgid = pgid

    def set_run_job(self, run_id: int, job_id: str) -> None:
        with self.session("recording a run's Slurm job") as s:
            self._run_row(s, run_id).slurm_job_id = job_id

    def end_run(self, run_id: int, end: RunEnd) -> Run:
        """Record how a running run ended. ConflictError if it already ended."""
        with self.session("recording a run end") as s:
            row = self._run_row(s, run_id)
            if row.status != RunStatus.RUNNING.value:
                raise ConflictError(f"run {run_id} already ended ({row.status})")
            counts.bump_runs(s, row.sweep_id, row.status, end.status.value)
            row.status, row.metric, row.summary = end.status.value, end.metric, dict(end.summary)
            row.throughput, row.throughput_unit = end.throughput, end.throughput_unit
            row.training_s, row.total_s = end.training_s, end.total_s
            row.throughput_source, row.holdout = end.throughput_source, end.holdout
            if end.note is not None:
                row.note = end.note[:NOTE_CHARS] or None
            row.curve = [list(p) for p in end.curve] if end.curve else None
            row.stop_fraction = end.stop_fraction
            row.ended_at = utcnow()
            return to_run(row)

    def set_run_status(self, run_id: int, status: RunStatus, note: str | None = None) -> None:
        """Flip an ended run between ok and suspect (the only change an ended run allows),
        with the keep rule's note on how it was placed (None: the note stays)."""
        allowed = {RunStatus.OK.value, RunStatus.SUSPECT.value}
        with self.session("updating a run") as s:
            row = self._run_row(s, run_id)
            if row.status not in allowed or status.value not in allowed:
                raise ConflictError(f"run {run_id} is {row.status}; cannot become {status.value}")
            counts.bump_runs(s, row.sweep_id, row.status, status.value)
            row.status = status.value
            if note is not None:
                row.note = note[:NOTE_CHARS] or None

    def list_runs(self, sweep_id: int | None = None, experiment_id: int | None = None) -> list[Run]:
        q = select(RunRow.__table__).order_by(RunRow.id)
        if sweep_id is not None:
            q = q.where(RunRow.sweep_id == sweep_id)
        if experiment_id is not None:
            q = q.where(RunRow.experiment_id == experiment_id)
        with self.session("listing runs") as s:
            return [to_run(r) for r in s.execute(q)]

    def run_log_paths(self, experiment_ids: Collection[int]) -> dict[int, list[str]]:
        if not experiment_ids:
            return {}
        q = (select(RunRow.experiment_id, RunRow.log_path)
             .where(RunRow.experiment_id.in_(list(experiment_ids)),
                    RunRow.log_path.is_not(None))
             .order_by(RunRow.id))
        out: dict[int, list[str]] = {}
        with self.session("reading run log paths") as s:
            for exp_id, path in s.execute(q):
                out.setdefault(exp_id, []).append(str(path))
        return out

    def interrupt_running_runs(self) -> list[Run]:
        """Mark every `running` run `interrupted` (left by a dead process) and return them."""
        with self.session("reaping interrupted runs") as s:
            q = select(RunRow).where(RunRow.status == RunStatus.RUNNING.value)
            rows = list(s.scalars(q))
            now = utcnow()
            for row in rows:
                counts.bump_runs(s, row.sweep_id, row.status, RunStatus.INTERRUPTED.value)
                row.status, row.ended_at = RunStatus.INTERRUPTED.value, now
            return [to_run(r) for r in rows]


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
