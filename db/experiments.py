"""An experiment's life: queue (atomic duplicate check), claim (guarded UPDATE), start, finish
(the transition table; a keep moves the sweep's best in the same transaction), interrupt."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from agent.core.domain import (
    FINISH_AS_IS,
    Experiment,
    ExperimentStatus,
    Finish,
    Proposal,
    born,
    check_finish,
    check_started,
    finished_meta,
    reaped_end,
    utcnow,
)
from agent.core.errors import ConflictError, DuplicateError, NotFoundError, StoreError
from agent.rules.admit import diff_key
from db import counts
from db.models import ExperimentRow, SweepRow
from db.rows import to_experiment, utc
from db.session import StoreBase

# The table's INSERT, not the ORM entity's: an ORM-enabled insert takes the bulk-persistence
# path on every call (its cost was the insert's largest part).
_INSERT = insert(cast(Table, ExperimentRow.__table__))
_SWEEP_EXISTS = select(SweepRow.id).where(SweepRow.id == bindparam("sweep_id"))


def _span_s(started: datetime | None, ended: datetime | None) -> float:
    """A run's seconds for the maintained counts (0 unless both times are set and ordered)."""
    a, b = utc(started), utc(ended)
    return max(0.0, (b - a).total_seconds()) if a is not None and b is not None else 0.0


class ExperimentWrites(StoreBase):
    # --- experiments --------------------------------------------------------------------
    def add_experiment(
        self,
        sweep_id: int,
        proposal: Proposal,
        *,
        ended: Finish | None = None,
        is_baseline: bool = False,
        attempt: int = 0,
        priority: int = 0,
        base_commit: str | None = None,
        retry_of: int | None = None,
    ) -> Experiment:
        """Insert one experiment (and count it) in one transaction; the row as stored. Queued,
        or `ended` (born finished: a refusal, a verdict reached without a run).

        A Core INSERT, not an ORM object: the row is known from its values and its new id,
        so nothing is flushed through the unit of work or read back (POST /experiments at
        agent speed spends most of its database time here)."""
        now = utcnow()
        exp = born(sweep_id, proposal, ended, now, is_baseline=is_baseline, attempt=attempt,
                   priority=priority, base_commit=base_commit, retry_of=retry_of)
        status, crash_kind = exp.status, exp.crash_kind
        try:
            with self.session("queueing an experiment") as s:
                self._check_new(s, sweep_id, retry_of)
                new_id = self._insert_experiment(s, exp)
                counts.bump(s, came=[counts.key(sweep_id, status.value,
                                                crash_kind.value if crash_kind else None)])
                return replace(exp, id=new_id)
        except StoreError as exc:
            if retry_of is not None and isinstance(exc.__cause__, IntegrityError):
                raise ConflictError(f"experiment {retry_of} already has a retry") from None
            raise

    @staticmethod
    def _check_new(s: Session, sweep_id: int, retry_of: int | None) -> None:
        if s.scalar(_SWEEP_EXISTS, {"sweep_id": sweep_id}) is None:
            raise NotFoundError(f"no sweep with id {sweep_id}")
        if retry_of is not None and s.scalar(
                select(ExperimentRow.id).where(ExperimentRow.retry_of == retry_of)):
            raise ConflictError(f"experiment {retry_of} already has a retry")

    @staticmethod
    def _insert_experiment(s: Session, exp: Experiment) -> int:
        """INSERT the row of `exp` (its id aside); the new id. DuplicateError when the same
        change is already active in the sweep (the unique partial index on diff_key)."""
        values: dict[str, Any] = {
            "sweep_id": exp.sweep_id, "parent_id": exp.parent_id, "retry_of": exp.retry_of,
            "attempt": exp.attempt, "is_baseline": exp.is_baseline, "priority": exp.priority,
            "proposer": exp.proposer, "description": exp.description, "diff": exp.diff,
            "diff_key": diff_key(exp.diff), "status": exp.status.value, "reason": exp.reason,
            "crash_kind": exp.crash_kind.value if exp.crash_kind else None,
            "base_commit": exp.base_commit, "meta": exp.meta, "summary": exp.summary,
            "created_at": exp.created_at, "finished_at": exp.finished_at,
        }
        if exp.status.is_finished():  # born ended: what its verdict recorded
            values |= {"metric": exp.metric, "best_before": exp.best_before,
                       "crash_cause": exp.crash_cause}
        try:
            res = s.execute(_INSERT, values)
            return int(res.inserted_primary_key[0])  # type: ignore[attr-defined]
        except IntegrityError as exc:
            if "diff_key" not in str(exc.orig):
                raise
            raise DuplicateError(
                "the same change is already queued or running in this sweep") from None

    def get_experiment(self, experiment_id: int) -> Experiment:
        with self.session("reading an experiment") as s:
            row = s.get(ExperimentRow, experiment_id)
            if row is None:
                raise NotFoundError(f"no experiment with id {experiment_id}")
            return to_experiment(row)

    def _claim(self, s: Session, experiment_id: int) -> ExperimentRow | None:
        now = utcnow()
        res = s.execute(
            update(ExperimentRow)
            .where(
                ExperimentRow.id == experiment_id,
                ExperimentRow.status == ExperimentStatus.QUEUED.value,
            )
            .values(status=ExperimentStatus.RUNNING.value, started_at=now)
        )
        if res.rowcount != 1:  # type: ignore[attr-defined]
            return None
        row = s.get(ExperimentRow, experiment_id, populate_existing=True)
        assert row is not None
        counts.bump(s, gone=[counts.key(row.sweep_id, ExperimentStatus.QUEUED.value, None)],
                    came=[counts.key(row.sweep_id, row.status, None)])
        return row

    def claim(self, experiment_id: int) -> Experiment | None:
        with self.session("claiming an experiment") as s:
            row = self._claim(s, experiment_id)
            return to_experiment(row) if row else None

    def claim_next(self, sweep_id: int | None = None) -> Experiment | None:
        """The highest-priority, oldest queued experiment, now `running`; None if none.

        SQLite: a few candidates, each tried with the guarded UPDATE (writers are serialised,
        so one of them is still queued unless all were just claimed). PostgreSQL: the first
        candidate that no other transaction has locked (FOR UPDATE SKIP LOCKED), so concurrent
        claimers take different rows instead of queueing behind the same one; the UPDATE
        stays guarded, which READ COMMITTED re-checks against the committed row.
        """
        q = select(ExperimentRow.id).where(ExperimentRow.status == ExperimentStatus.QUEUED.value)
        if sweep_id is not None:
            q = q.where(ExperimentRow.sweep_id == sweep_id)
        q = q.order_by(ExperimentRow.priority.desc(), ExperimentRow.id)
        if self.engine.dialect.name == "postgresql":
            q = q.limit(1).with_for_update(skip_locked=True)
        else:
            q = q.limit(5)
        with self.session("claiming the next experiment") as s:
            for exp_id in list(s.scalars(q)):
                row = self._claim(s, exp_id)
                if row is not None:
                    return to_experiment(row)
            return None

    def mark_started(self, experiment_id: int, **fields: Any) -> None:
        with self.session("recording a run start") as s:
            row = s.get(ExperimentRow, experiment_id)
            if row is None:
                raise NotFoundError(f"no experiment with id {experiment_id}")
            check_started(experiment_id, ExperimentStatus(row.status), fields)
            for key, value in fields.items():
                if value is not None:
                    setattr(row, key, value)

    def finish(
        self, experiment_id: int, finish: Finish, keep_commit: str | None = None
    ) -> Experiment:
        """Record the end of an experiment; with `keep_commit`, also make it the sweep's best
        in the same transaction (so a kill between the two can never split them)."""
        with self.session("finishing an experiment") as s:
            row = s.get(ExperimentRow, experiment_id)
            if row is None:
                raise NotFoundError(f"no experiment with id {experiment_id}")
            check_finish(experiment_id, ExperimentStatus(row.status), finish,
                         keeps=keep_commit is not None)
            gone = counts.key(row.sweep_id, row.status, row.crash_kind)
            row.status = finish.status.value
            row.crash_kind = finish.crash_kind.value if finish.crash_kind else None
            row.run_started_at = finish.run_started_at or row.run_started_at
            row.run_ended_at = finish.run_ended_at
            counts.bump(s, gone=[gone], came=[counts.key(row.sweep_id, row.status,
                                                         row.crash_kind)],
                        run_s=_span_s(row.run_started_at, row.run_ended_at))
            for name in FINISH_AS_IS:  # reason, metric, best before, log tail, run end, cause
                setattr(row, name, getattr(finish, name))
            row.summary = dict(finish.summary)
            row.finished_at = utcnow()
            if finish.warnings or finish.record is not None:
                row.meta = finished_meta(row.meta, finish)
            if keep_commit is not None:
                row.commit = keep_commit
                sweep = s.get(SweepRow, row.sweep_id)
                assert sweep is not None
                if row.is_baseline:
                    sweep.baseline_metric = finish.best
                sweep.best_metric, sweep.best_commit = finish.best, keep_commit
                sweep.best_experiment_id = row.id
                sweep.updated_at = utcnow()
            return to_experiment(row)

    def request_cancel(self, experiment_id: int, reason: str) -> bool:
        """Record that a running experiment is to be cancelled (one guarded UPDATE)."""
        q = (update(ExperimentRow)
             .where(ExperimentRow.id == experiment_id,
                    ExperimentRow.status == ExperimentStatus.RUNNING.value)
             .values(cancel_reason=reason))
        with self.session("recording a cancel") as s:
            return bool(s.execute(q).rowcount)  # type: ignore[attr-defined]

    def interrupt_running(self) -> list[Experiment]:
        """Mark every `running` experiment `interrupted` (a dead process left them), or
        `cancelled` where a cancel was requested (request_cancel) before it died."""
        with self.session("reaping interrupted experiments") as s:
            rows = list(
                s.scalars(
                    select(ExperimentRow).where(
                        ExperimentRow.status == ExperimentStatus.RUNNING.value
                    )
                )
            )
            now = utcnow()
            ends = {r.id: reaped_end(r.cancel_reason) for r in rows}
            counts.bump(s, gone=[counts.key(r.sweep_id, r.status, r.crash_kind) for r in rows],
                        came=[counts.key(r.sweep_id, ends[r.id][0].value, r.crash_kind)
                              for r in rows])
            for row in rows:
                status, row.reason = ends[row.id]
                row.status = status.value
                row.finished_at = now
            return [to_experiment(r) for r in rows]
