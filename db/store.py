"""SqlStore: the agent.ports.Store contract on SQLAlchemy 2.0 (sync sessions, short transactions).

Finished experiments are read-only; queued → running is a guarded UPDATE so two workers
never claim the same row; every driver error surfaces as one StoreError naming the action.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, delete, func, insert, select, text, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from agent.admit import diff_key
from agent.config import TargetConfig
from agent.domain import (
    CrashKind,
    Experiment,
    ExperimentStatus,
    Finish,
    Proposal,
    Run,
    RunEnd,
    RunRole,
    RunSpec,
    RunStatus,
    Sweep,
    SweepStatus,
    can_transition,
    utcnow,
)
from agent.errors import ConflictError, DuplicateError, NotFoundError, StoreError
from agent.ports import Store, SweepSpec
from db.models import ExperimentRow, LossPointRow, RunRow, SweepRow
from runner.summary import ProgressPoint

logger = logging.getLogger(__name__)


# Experiment fields the dashboard's pages need; log_tail, meta and pgid are left out.
BRIEF_FIELDS = (
    "id", "sweep_id", "status", "description", "diff", "proposer", "parent_id", "retry_of",
    "attempt", "is_baseline", "crash_kind", "reason", "metric", "best_before", "summary",
    "log_path", "commit", "base_commit", "ref", "created_at", "started_at", "finished_at",
    "run_started_at", "run_ended_at",
)  # fmt: skip


def to_sweep(row: SweepRow) -> Sweep:
    return Sweep(
        id=row.id,
        name=row.name,
        target_path=row.target_path,
        branch=row.branch,
        status=SweepStatus(row.status),
        proposer=row.proposer,
        config=TargetConfig.from_dict(dict(row.config)),
        max_experiments=row.max_experiments,
        baseline_metric=row.baseline_metric,
        best_metric=row.best_metric,
        best_commit=row.best_commit,
        best_experiment_id=row.best_experiment_id,
        created_at=row.created_at,
        deadline=row.deadline,
        window=row.window,
        start_at=row.start_at,
    )


def to_experiment(row: ExperimentRow) -> Experiment:
    return Experiment(
        id=row.id,
        sweep_id=row.sweep_id,
        status=ExperimentStatus(row.status),
        description=row.description,
        diff=row.diff,
        proposer=row.proposer,
        parent_id=row.parent_id,
        retry_of=row.retry_of,
        attempt=row.attempt,
        is_baseline=row.is_baseline,
        priority=row.priority,
        base_commit=row.base_commit,
        commit=row.commit,
        ref=row.ref,
        crash_kind=CrashKind(row.crash_kind) if row.crash_kind else None,
        reason=row.reason,
        metric=row.metric,
        best_before=row.best_before,
        summary=dict(row.summary or {}),
        log_path=row.log_path,
        log_tail=row.log_tail,
        pgid=row.pgid,
        meta=dict(row.meta or {}),
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        run_started_at=row.run_started_at,
        run_ended_at=row.run_ended_at,
    )


def to_run(row: RunRow) -> Run:
    return Run(
        id=row.id,
        sweep_id=row.sweep_id,
        experiment_id=row.experiment_id,
        commit=row.commit,
        seed=row.seed,
        role=RunRole(row.role),
        status=RunStatus(row.status),
        metric=row.metric,
        summary=dict(row.summary or {}),
        throughput=row.throughput,
        throughput_unit=row.throughput_unit,
        training_s=row.training_s,
        total_s=row.total_s,
        pgid=row.pgid,
        log_path=row.log_path,
        device=row.device,
        started_at=row.started_at,
        ended_at=row.ended_at,
    )


class SqlStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def session(self, action: str) -> Iterator[Session]:
        """One transaction: commit on success, roll back on error, one readable StoreError."""
        with self._sessions() as s:
            try:
                yield s
                s.commit()
            except (NotFoundError, ConflictError):
                s.rollback()
                raise
            except SQLAlchemyError as exc:
                s.rollback()
                raise StoreError(
                    f"database error while {action}: {exc.__class__.__name__}: "
                    f"{getattr(exc, 'orig', exc)}"
                ) from exc
            except BaseException:
                s.rollback()
                raise

    # --- sweeps -------------------------------------------------------------------------
    def ping(self) -> None:
        with self.session("checking the database") as s:
            s.execute(text("SELECT 1"))

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
        row = s.scalar(select(SweepRow).where(SweepRow.name == name))
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

    def list_sweeps(self) -> list[Sweep]:
        with self.session("listing sweeps") as s:
            return [to_sweep(r) for r in s.scalars(select(SweepRow).order_by(SweepRow.id))]

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

    # --- experiments --------------------------------------------------------------------
    def add_experiment(
        self,
        sweep_id: int,
        proposal: Proposal,
        *,
        status: ExperimentStatus = ExperimentStatus.QUEUED,
        reason: str | None = None,
        is_baseline: bool = False,
        attempt: int = 0,
        priority: int = 0,
        base_commit: str | None = None,
        retry_of: int | None = None,
    ) -> Experiment:
        now = utcnow()
        row = ExperimentRow(
            sweep_id=sweep_id,
            parent_id=proposal.parent_id,
            retry_of=retry_of,
            attempt=attempt,
            is_baseline=is_baseline,
            priority=priority,
            proposer=proposal.proposer,
            description=proposal.description,
            diff=proposal.diff,
            diff_key=diff_key(proposal.diff),
            status=status.value,
            reason=reason,
            base_commit=base_commit,
            meta=dict(proposal.meta),
            summary={},
            created_at=now,
            finished_at=now if status.is_finished() else None,
        )
        try:
            with self.session("queueing an experiment") as s:
                if s.get(SweepRow, sweep_id) is None:
                    raise NotFoundError(f"no sweep with id {sweep_id}")
                if retry_of is not None and s.scalar(
                        select(ExperimentRow.id).where(ExperimentRow.retry_of == retry_of)):
                    raise ConflictError(f"experiment {retry_of} already has a retry")
                s.add(row)
                try:
                    s.flush()
                except IntegrityError as exc:
                    if "diff_key" not in str(exc.orig):
                        raise
                    raise DuplicateError(
                        "the same change is already queued or running in this sweep"
                    ) from None
                return to_experiment(row)
        except StoreError as exc:
            if retry_of is not None and isinstance(exc.__cause__, IntegrityError):
                raise ConflictError(f"experiment {retry_of} already has a retry") from None
            raise

    def get_experiment(self, experiment_id: int) -> Experiment:
        with self.session("reading an experiment") as s:
            row = s.get(ExperimentRow, experiment_id)
            if row is None:
                raise NotFoundError(f"no experiment with id {experiment_id}")
            return to_experiment(row)

    def list_experiments(
        self,
        sweep_id: int | None = None,
        statuses: Sequence[ExperimentStatus] | None = None,
        limit: int | None = None,
        newest_first: bool = False,
        before_id: int | None = None,
        crash_kind: CrashKind | None = None,
    ) -> list[Experiment]:
        q = select(ExperimentRow)
        if sweep_id is not None:
            q = q.where(ExperimentRow.sweep_id == sweep_id)
        if statuses:
            q = q.where(ExperimentRow.status.in_([st.value for st in statuses]))
        if crash_kind is not None:
            q = q.where(ExperimentRow.crash_kind == crash_kind.value)
        if before_id is not None:
            q = q.where(ExperimentRow.id < before_id)
        q = q.order_by(ExperimentRow.id.desc() if newest_first else ExperimentRow.id)
        if limit is not None:
            q = q.limit(limit)
        with self.session("listing experiments") as s:
            return [to_experiment(r) for r in s.scalars(q)]

    def experiment_briefs(self, sweep_id: int) -> list[Experiment]:
        """The sweep's experiments, oldest first, with `log_tail` None and `meta` empty: only
        the columns the pages use (a log tail is kilobytes; a sweep page lists thousands)."""
        cols = [getattr(ExperimentRow, f) for f in BRIEF_FIELDS]
        q = select(*cols).where(ExperimentRow.sweep_id == sweep_id).order_by(ExperimentRow.id)
        out = []
        with self.session("listing a sweep's experiments") as s:
            for row in s.execute(q):
                d = dict(zip(BRIEF_FIELDS, row, strict=True))
                d["status"] = ExperimentStatus(d["status"])
                d["crash_kind"] = CrashKind(d["crash_kind"]) if d["crash_kind"] else None
                d["summary"] = dict(d["summary"] or {})
                out.append(Experiment(**d))
        return out

    def run_spans(self) -> list[tuple[int, ExperimentStatus, datetime | None, datetime | None]]:
        """(sweep id, status, run started, run ended) of every experiment, in one query."""
        q = select(ExperimentRow.sweep_id, ExperimentRow.status, ExperimentRow.run_started_at,
                   ExperimentRow.run_ended_at)
        with self.session("summarising sweeps") as s:
            return [(sid, ExperimentStatus(st), a, b) for sid, st, a, b in s.execute(q)]

    def has_diff(self, sweep_id: int, diff: str) -> Experiment | None:
        key = diff_key(diff)
        if key is None:
            return None
        q = (
            select(ExperimentRow)
            .where(
                ExperimentRow.sweep_id == sweep_id,
                ExperimentRow.diff_key == key,
                ExperimentRow.status != ExperimentStatus.REJECTED.value,
            )
            .order_by(ExperimentRow.id)
            .limit(1)
        )
        with self.session("looking up a diff") as s:
            row = s.scalar(q)
            return to_experiment(row) if row else None

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
        return s.get(ExperimentRow, experiment_id, populate_existing=True)

    def claim(self, experiment_id: int) -> Experiment | None:
        with self.session("claiming an experiment") as s:
            row = self._claim(s, experiment_id)
            return to_experiment(row) if row else None

    def claim_next(self, sweep_id: int | None = None) -> Experiment | None:
        q = select(ExperimentRow.id).where(ExperimentRow.status == ExperimentStatus.QUEUED.value)
        if sweep_id is not None:
            q = q.where(ExperimentRow.sweep_id == sweep_id)
        q = q.order_by(ExperimentRow.priority.desc(), ExperimentRow.id).limit(5)
        with self.session("claiming the next experiment") as s:
            for exp_id in list(s.scalars(q)):
                row = self._claim(s, exp_id)
                if row is not None:
                    return to_experiment(row)
            return None

    def mark_started(self, experiment_id: int, **fields: Any) -> None:
        allowed = {"commit", "ref", "base_commit", "log_path", "pgid", "run_started_at"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"mark_started: unknown field(s) {sorted(bad)}")
        with self.session("recording a run start") as s:
            row = s.get(ExperimentRow, experiment_id)
            if row is None:
                raise NotFoundError(f"no experiment with id {experiment_id}")
            if ExperimentStatus(row.status).is_finished():
                raise ConflictError(f"experiment {experiment_id} is finished ({row.status})")
            for key, value in fields.items():
                if value is not None:
                    setattr(row, key, value)

    def finish(
        self, experiment_id: int, finish: Finish, keep_commit: str | None = None
    ) -> Experiment:
        """Record the end of an experiment; with `keep_commit`, also make it the sweep's best
        in the same transaction (so a kill between the two can never split them)."""
        if not finish.status.is_finished():
            raise ValueError(f"finish needs a finished status, got {finish.status.value}")
        with self.session("finishing an experiment") as s:
            row = s.get(ExperimentRow, experiment_id)
            if row is None:
                raise NotFoundError(f"no experiment with id {experiment_id}")
            old = ExperimentStatus(row.status)
            if old.is_finished():
                raise ConflictError(f"experiment {experiment_id} is already {old.value}")
            if not can_transition(old, finish.status):
                raise ConflictError(f"experiment {experiment_id} is {old.value}; it cannot "
                                    f"become {finish.status.value}")
            row.status = finish.status.value
            row.crash_kind = finish.crash_kind.value if finish.crash_kind else None
            row.reason = finish.reason
            row.metric, row.best_before = finish.metric, finish.best_before
            row.summary = dict(finish.summary)
            row.log_tail = finish.log_tail
            row.run_started_at = finish.run_started_at or row.run_started_at
            row.run_ended_at = finish.run_ended_at
            row.finished_at = utcnow()
            if finish.warnings:
                row.meta = {**(row.meta or {}), "warnings": list(finish.warnings)}
            if keep_commit is not None:
                if finish.metric is None:
                    raise ValueError("keep_commit needs a metric")
                row.commit = keep_commit
                sweep = s.get(SweepRow, row.sweep_id)
                assert sweep is not None
                if row.is_baseline:
                    sweep.baseline_metric = finish.metric
                sweep.best_metric, sweep.best_commit = finish.metric, keep_commit
                sweep.best_experiment_id = row.id
                sweep.updated_at = utcnow()
            return to_experiment(row)

    def interrupt_running(self) -> list[Experiment]:
        """Mark every `running` experiment `interrupted` (a dead process left them)."""
        with self.session("reaping interrupted experiments") as s:
            rows = list(
                s.scalars(
                    select(ExperimentRow).where(
                        ExperimentRow.status == ExperimentStatus.RUNNING.value
                    )
                )
            )
            now = utcnow()
            for row in rows:
                row.status = ExperimentStatus.INTERRUPTED.value
                row.reason = "the service stopped while this experiment was running"
                row.finished_at = now
            return [to_experiment(r) for r in rows]

    # --- loss curve ---------------------------------------------------------------------
    def add_loss_points(self, experiment_id: int, points: Sequence[ProgressPoint]) -> None:
        if not points:
            return
        with self.session("recording loss points") as s:
            s.execute(insert(LossPointRow), _loss_rows(experiment_id, points))

    def replace_loss_points(self, experiment_id: int, points: Sequence[ProgressPoint]) -> None:
        with self.session("recording loss points") as s:
            s.execute(delete(LossPointRow).where(LossPointRow.experiment_id == experiment_id))
            if points:
                s.execute(insert(LossPointRow), _loss_rows(experiment_id, points))

    def loss_points(self, experiment_id: int) -> list[ProgressPoint]:
        q = (
            select(LossPointRow)
            .where(LossPointRow.experiment_id == experiment_id)
            .order_by(LossPointRow.step, LossPointRow.id)
        )
        with self.session("reading loss points") as s:
            return [ProgressPoint(r.step, r.loss, r.elapsed_s) for r in s.scalars(q)]

    def timestamps(self, sweep_id: int) -> list[tuple[datetime | None, datetime | None]]:
        q = (
            select(ExperimentRow.run_started_at, ExperimentRow.run_ended_at)
            .where(ExperimentRow.sweep_id == sweep_id)
            .order_by(ExperimentRow.id)
        )
        with self.session("reading run times") as s:
            return [(a, b) for a, b in s.execute(q)]

    # --- service queries (additive: used by the API, the scheduler and restart recovery) ---
    def count_experiments(
        self,
        sweep_id: int | None = None,
        statuses: Sequence[ExperimentStatus] | None = None,
        crash_kind: CrashKind | None = None,
        is_baseline: bool | None = None,
    ) -> int:
        """How many experiments match; every filter is optional (None = any)."""
        q = select(func.count(ExperimentRow.id))
        if sweep_id is not None:
            q = q.where(ExperimentRow.sweep_id == sweep_id)
        if statuses:
            q = q.where(ExperimentRow.status.in_([st.value for st in statuses]))
        if crash_kind is not None:
            q = q.where(ExperimentRow.crash_kind == crash_kind.value)
        if is_baseline is not None:
            q = q.where(ExperimentRow.is_baseline == is_baseline)
        with self.session("counting experiments") as s:
            return int(s.scalar(q) or 0)

    def status_counts(self, sweep_id: int | None = None) -> dict[str, int]:
        """Experiments per status, of one sweep or the whole database."""
        q = select(ExperimentRow.status, func.count(ExperimentRow.id)).group_by(
            ExperimentRow.status
        )
        if sweep_id is not None:
            q = q.where(ExperimentRow.sweep_id == sweep_id)
        with self.session("counting experiments") as s:
            return {status: int(n) for status, n in s.execute(q)}

    def retry_of(self, experiment_id: int) -> Experiment | None:
        """The row re-queued for an interrupted experiment, if any."""
        q = select(ExperimentRow).where(ExperimentRow.retry_of == experiment_id)
        with self.session("looking up a retry") as s:
            row = s.scalar(q)
            return to_experiment(row) if row is not None else None

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
            started_at=utcnow(),
        )
        with self.session("recording a run start") as s:
            if s.get(ExperimentRow, spec.experiment_id) is None:
                raise NotFoundError(f"no experiment with id {spec.experiment_id}")
            s.add(row)
            s.flush()
            return to_run(row)

    def _run_row(self, s: Session, run_id: int) -> RunRow:
        row = s.get(RunRow, run_id)
        if row is None:
            raise NotFoundError(f"no run with id {run_id}")
        return row

    def set_run_pgid(self, run_id: int, pgid: int) -> None:
        with self.session("recording a run's process group") as s:
            self._run_row(s, run_id).pgid = pgid

    def end_run(self, run_id: int, end: RunEnd) -> Run:
        """Record how a running run ended. ConflictError if it already ended."""
        with self.session("recording a run end") as s:
            row = self._run_row(s, run_id)
            if row.status != RunStatus.RUNNING.value:
                raise ConflictError(f"run {run_id} already ended ({row.status})")
            row.status, row.metric, row.summary = end.status.value, end.metric, dict(end.summary)
            row.throughput, row.throughput_unit = end.throughput, end.throughput_unit
            row.training_s, row.total_s = end.training_s, end.total_s
            row.ended_at = utcnow()
            return to_run(row)

    def set_run_status(self, run_id: int, status: RunStatus) -> None:
        """Flip an ended run between ok and suspect (the only change an ended run allows)."""
        allowed = {RunStatus.OK.value, RunStatus.SUSPECT.value}
        with self.session("updating a run") as s:
            row = self._run_row(s, run_id)
            if row.status not in allowed or status.value not in allowed:
                raise ConflictError(f"run {run_id} is {row.status}; cannot become {status.value}")
            row.status = status.value

    def list_runs(self, sweep_id: int | None = None, experiment_id: int | None = None) -> list[Run]:
        q = select(RunRow).order_by(RunRow.id)
        if sweep_id is not None:
            q = q.where(RunRow.sweep_id == sweep_id)
        if experiment_id is not None:
            q = q.where(RunRow.experiment_id == experiment_id)
        with self.session("listing runs") as s:
            return [to_run(r) for r in s.scalars(q)]

    def interrupt_running_runs(self) -> list[Run]:
        """Mark every `running` run `interrupted` (left by a dead process) and return them."""
        with self.session("reaping interrupted runs") as s:
            q = select(RunRow).where(RunRow.status == RunStatus.RUNNING.value)
            rows = list(s.scalars(q))
            now = utcnow()
            for row in rows:
                row.status, row.ended_at = RunStatus.INTERRUPTED.value, now
            return [to_run(r) for r in rows]


def _implements_the_port(store: SqlStore) -> Store:
    """mypy checks here that SqlStore has every method of the Store port."""
    return store


def _loss_rows(experiment_id: int, points: Sequence[ProgressPoint]) -> list[dict[str, Any]]:
    """Plain rows for one bulk INSERT (the ORM's per-object path is ~50x slower here)."""
    return [{"experiment_id": experiment_id, "step": p.step, "loss": p.loss,
             "elapsed_s": p.elapsed_s} for p in points]
