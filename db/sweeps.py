"""The sweep rows: create, read, status, start time, best, LLM usage."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from agent.core.domain import Sweep, SweepStatus, utcnow
from agent.core.errors import ConflictError, NotFoundError, StoreError
from agent.core.ports import SweepSpec
from db.models import ExperimentRow, SweepRow
from db.rows import to_sweep
from db.session import StoreBase

# A sweep by name: read on every POST /experiments, built once (values bound at execute).
_BY_NAME = select(SweepRow).where(SweepRow.name == bindparam("name"))


class SweepQueries(StoreBase):
    # --- sweeps -------------------------------------------------------------------------
    def create_sweep(self, spec: SweepSpec) -> Sweep:
        now = utcnow()
        row = SweepRow(
            name=spec.name,
            target_path=spec.target_path,
            branch=spec.branch,
            status=SweepStatus.RUNNING.value,
            proposer=spec.proposer,
            config=spec.config.to_dict(),
            protected_hashes=spec.protected_hashes,
            max_experiments=spec.max_experiments,
            deadline=spec.deadline,
            window=spec.window,
            created_at=now,
            updated_at=now,
        )
        try:
            with self.session("creating a sweep") as s:
                s.add(row)
                s.flush()
                return to_sweep(row)
        except StoreError as exc:
            if isinstance(exc.__cause__, IntegrityError):
                raise ConflictError(f"a sweep named {spec.name!r} already exists") from None
            raise

    def _sweep_row(self, s: Session, name: str) -> SweepRow:
        row = s.scalar(_BY_NAME, {"name": name})
        if row is None:
            raise NotFoundError(f"no sweep named {name!r}")
        return row

    def get_sweep(self, name: str) -> Sweep:
        with self.session("reading a sweep") as s:
            return to_sweep(self._sweep_row(s, name))

    def get_sweep_by_id(self, sweep_id: int) -> Sweep:
        with self.session("reading a sweep") as s:
            row = s.get(SweepRow, sweep_id)
            if row is None:
                raise NotFoundError(f"no sweep with id {sweep_id}")
            return to_sweep(row)

    def protected_hashes(self, sweep_id: int) -> dict[str, str]:
        with self.session("reading a sweep") as s:
            row = s.get(SweepRow, sweep_id)
            return dict(row.protected_hashes) if row else {}

    def list_sweeps(self, statuses: Collection[SweepStatus] | None = None) -> list[Sweep]:
        q = select(SweepRow).order_by(SweepRow.id)
        if statuses is not None:
            q = q.where(SweepRow.status.in_([st.value for st in statuses]))
        with self.session("listing sweeps") as s:
            return [to_sweep(r) for r in s.scalars(q)]

    def set_sweep_status(self, name: str, status: SweepStatus) -> Sweep:
        with self.session("updating a sweep") as s:
            row = self._sweep_row(s, name)
            row.status = status.value
            row.updated_at = utcnow()
            return to_sweep(row)

    def set_start_at(self, name: str, when: datetime | None) -> Sweep:
        with self.session("scheduling a sweep's start") as s:
            row = self._sweep_row(s, name)
            row.start_at = when
            row.updated_at = utcnow()
            s.flush()
            return to_sweep(row)

    def set_best(
        self, sweep_id: int, experiment_id: int, metric: float, commit: str, baseline: bool
    ) -> None:
        with self.session("recording a new best") as s:
            row = s.get(SweepRow, sweep_id)
            if row is None:
                raise NotFoundError(f"no sweep with id {sweep_id}")
            if baseline:
                row.baseline_metric = metric
            row.best_metric, row.best_commit, row.best_experiment_id = metric, commit, experiment_id
            row.updated_at = utcnow()

    def add_llm_usage(
        self, sweep_id: int, experiment_id: int | None, tokens_in: int, tokens_out: int, usd: float
    ) -> None:
        with self.session("recording LLM usage") as s:
            sweep = s.get(SweepRow, sweep_id)
            if sweep is not None:
                sweep.llm_tokens_in += tokens_in
                sweep.llm_tokens_out += tokens_out
                sweep.llm_usd += usd
            exp = s.get(ExperimentRow, experiment_id) if experiment_id else None
            if exp is not None:
                exp.llm_tokens_in += tokens_in
                exp.llm_tokens_out += tokens_out
                exp.llm_usd += usd

    def llm_usage(self, sweep_id: int) -> tuple[int, int, float]:
        with self.session("reading LLM usage") as s:
            row = s.get(SweepRow, sweep_id)
            return (row.llm_tokens_in, row.llm_tokens_out, row.llm_usd) if row else (0, 0, 0.0)
