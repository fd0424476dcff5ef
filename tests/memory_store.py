"""An in-memory Store for tests: the Store port (agent.core.ports) in dicts under one lock.

tests/test_store_contract.py runs one suite against it and the SQL stores (SQLite, PostgreSQL),
so the port's written contract is the behaviour of each; the invariants of a record are the
core's (agent.core.domain.check_started, check_finish), as for every store. The read models of
the pages (db.reads) are the SQL store's only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime

from agent.core.domain import (
    FINISH_AS_IS,
    CrashKind,
    Experiment,
    ExperimentStatus,
    Finish,
    Proposal,
    Run,
    RunEnd,
    RunSpec,
    RunStatus,
    Sweep,
    SweepStatus,
    born,
    check_finish,
    check_started,
    finished_meta,
    reaped_end,
    utcnow,
)
from agent.core.errors import ConflictError, DuplicateError, NotFoundError
from agent.core.ports import Pruned, Store, SweepSpec
from agent.rules.admit import diff_key
from runner.summary import ProgressPoint

ACTIVE = (ExperimentStatus.QUEUED, ExperimentStatus.RUNNING)  # one per change and sweep


def _newer(after_id: int | None, ids: Collection[int]) -> Callable[[int], bool]:
    """Which ids a read `after_id` / `ids` wants (every id without either)."""
    if after_id is None and not ids:
        return lambda _: True
    wanted = set(ids)
    return lambda i: (after_id is not None and i > after_id) or i in wanted


class MemoryStore:
    """Store port in memory; every method is atomic under one lock (like a transaction)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._sweeps: dict[int, Sweep] = {}
        self._hashes: dict[int, dict[str, str]] = {}
        self._usage: dict[int, tuple[int, int, float]] = {}
        self._cancels: dict[int, str] = {}  # requested cancels of running rows
        self._exps: dict[int, Experiment] = {}
        self._keys: dict[int, str | None] = {}
        self._points: dict[int, list[ProgressPoint]] = {}
        self._runs: dict[int, Run] = {}

    @contextmanager
    def reading(self) -> Iterator[None]:
        """The reads inside see one state: the store's lock is held for the block."""
        with self._lock:
            yield

    # --- sweeps -------------------------------------------------------------------------
    def create_sweep(self, spec: SweepSpec) -> Sweep:
        with self._lock:
            if any(s.name == spec.name for s in self._sweeps.values()):
                raise ConflictError(f"a sweep named {spec.name!r} already exists")
            sweep = Sweep(
                id=len(self._sweeps) + 1, name=spec.name, target_path=spec.target_path,
                branch=spec.branch, status=SweepStatus.RUNNING, proposer=spec.proposer,
                config=spec.config, max_experiments=spec.max_experiments,
                baseline_metric=None, best_metric=None, best_commit=None,
                best_experiment_id=None, created_at=utcnow(), deadline=spec.deadline,
                window=spec.window,
            )
            self._sweeps[sweep.id] = sweep
            self._hashes[sweep.id] = dict(spec.protected_hashes)
            self._usage[sweep.id] = (0, 0, 0.0)
            return sweep

    def get_sweep(self, name: str) -> Sweep:
        with self._lock:
            for sweep in self._sweeps.values():
                if sweep.name == name:
                    return sweep
        raise NotFoundError(f"no sweep named {name!r}")

    def get_sweep_by_id(self, sweep_id: int) -> Sweep:
        with self._lock:
            if sweep_id not in self._sweeps:
                raise NotFoundError(f"no sweep with id {sweep_id}")
            return self._sweeps[sweep_id]

    def list_sweeps(self, statuses: Collection[SweepStatus] | None = None) -> list[Sweep]:
        with self._lock:
            return [self._sweeps[i] for i in sorted(self._sweeps)
                    if statuses is None or self._sweeps[i].status in statuses]

    def _update_sweep(self, name: str, **changes: object) -> Sweep:
        with self._lock:
            sweep = replace(self.get_sweep(name), **changes)  # type: ignore[arg-type]
            self._sweeps[sweep.id] = sweep
            return sweep

    def set_sweep_status(self, name: str, status: SweepStatus) -> Sweep:
        return self._update_sweep(name, status=status)

    def set_start_at(self, name: str, when: datetime | None) -> Sweep:
        return self._update_sweep(name, start_at=when)

    def set_best(self, sweep_id: int, experiment_id: int, metric: float, commit: str,
                 baseline: bool) -> None:
        with self._lock:
            sweep = self.get_sweep_by_id(sweep_id)
            self._sweeps[sweep_id] = replace(
                sweep, best_metric=metric, best_commit=commit, best_experiment_id=experiment_id,
                baseline_metric=metric if baseline else sweep.baseline_metric)

    def protected_hashes(self, sweep_id: int) -> dict[str, str]:
        with self._lock:
            self.get_sweep_by_id(sweep_id)
            return dict(self._hashes[sweep_id])

    def add_llm_usage(self, sweep_id: int, experiment_id: int | None, tokens_in: int,
                      tokens_out: int, usd: float) -> None:
        with self._lock:
            t_in, t_out, dollars = self._usage.get(sweep_id, (0, 0, 0.0))
            self._usage[sweep_id] = (t_in + tokens_in, t_out + tokens_out, dollars + usd)
            self._sweeps[sweep_id] = replace(self.get_sweep_by_id(sweep_id),
                                             llm_spend=self._usage[sweep_id])

    def llm_usage(self, sweep_id: int) -> tuple[int, int, float]:
        with self._lock:
            return self._usage.get(sweep_id, (0, 0, 0.0))

    # --- experiments ----------------------------------------------------------------------
    def add_experiment(self, sweep_id: int, proposal: Proposal, *,
                       ended: Finish | None = None, is_baseline: bool = False, attempt: int = 0,
                       priority: int = 0, base_commit: str | None = None,
                       retry_of: int | None = None) -> Experiment:
        with self._lock:
            self.get_sweep_by_id(sweep_id)
            if retry_of is not None and self.retry_of(retry_of) is not None:
                raise ConflictError(f"experiment {retry_of} already has a retry")
            key = diff_key(proposal.diff)
            exp = replace(born(sweep_id, proposal, ended, utcnow(), is_baseline=is_baseline,
                               attempt=attempt, priority=priority, base_commit=base_commit,
                               retry_of=retry_of), id=len(self._exps) + 1)
            if key is not None and exp.status in ACTIVE and any(
                    self._keys[e.id] == key and e.sweep_id == sweep_id and e.status in ACTIVE
                    for e in self._exps.values()):
                raise DuplicateError("the same change is already queued or running in this sweep")
            self._exps[exp.id] = exp
            self._keys[exp.id] = key
            return exp

    def get_experiment(self, experiment_id: int) -> Experiment:
        with self._lock:
            if experiment_id not in self._exps:
                raise NotFoundError(f"no experiment with id {experiment_id}")
            return self._exps[experiment_id]

    def _select(self, sweep_id: int | None = None,
                statuses: Sequence[ExperimentStatus] | None = None,
                crash_kind: CrashKind | None = None, is_baseline: bool | None = None,
                where: Callable[[Experiment], bool] | None = None) -> list[Experiment]:
        with self._lock:
            rows = [self._exps[i] for i in sorted(self._exps)]
        return [e for e in rows
                if (sweep_id is None or e.sweep_id == sweep_id)
                and (not statuses or e.status in statuses)
                and (crash_kind is None or e.crash_kind is crash_kind)
                and (is_baseline is None or e.is_baseline == is_baseline)
                and (where is None or where(e))]

    def list_experiments(self, sweep_id: int | None = None,
                         statuses: Sequence[ExperimentStatus] | None = None,
                         limit: int | None = None, newest_first: bool = False,
                         before_id: int | None = None,
                         crash_kind: CrashKind | None = None,
                         after_id: int | None = None, since: datetime | None = None,
                         until: datetime | None = None) -> list[Experiment]:
        lo, hi = after_id or 0, before_id or float("inf")

        def wanted(e: Experiment) -> bool:
            return lo < e.id < hi and _within(e.created_at, since, until)

        rows = self._select(sweep_id, statuses, crash_kind, where=wanted)
        if newest_first:
            rows.reverse()
        return rows if limit is None else rows[:limit]

    def run_metrics(self, sweep_id: int, after_id: int | None = None,
                    ids: Collection[int] = ()) -> list[Run]:
        wanted = _newer(after_id, ids)
        return [Run(id=r.id, sweep_id=r.sweep_id, experiment_id=r.experiment_id,
                    commit=r.commit, seed=r.seed, role=r.role, status=r.status, metric=r.metric,
                    throughput=r.throughput, throughput_source=r.throughput_source,
                    device=r.device, pair_run_id=r.pair_run_id, note=r.note)
                for r in self.list_runs(sweep_id=sweep_id) if wanted(r.id)]

    def count_experiments(self, sweep_id: int | None = None,
                          statuses: Sequence[ExperimentStatus] | None = None,
                          crash_kind: CrashKind | None = None,
                          is_baseline: bool | None = None) -> int:
        return len(self._select(sweep_id, statuses, crash_kind, is_baseline))

    def retry_of(self, experiment_id: int) -> Experiment | None:
        rows = self._select(where=lambda e: e.retry_of == experiment_id)
        return rows[0] if rows else None

    def has_diff(self, sweep_id: int, diff: str) -> Experiment | None:
        key = diff_key(diff)
        if key is None:
            return None
        with self._lock:
            rows = self._select(sweep_id, where=lambda e: self._keys[e.id] == key
                                and e.status is not ExperimentStatus.REJECTED)
        return rows[0] if rows else None

    # --- lifecycle ------------------------------------------------------------------------
    def claim(self, experiment_id: int) -> Experiment | None:
        with self._lock:
            exp = self._exps.get(experiment_id)
            if exp is None or exp.status is not ExperimentStatus.QUEUED:
                return None
            exp = replace(exp, status=ExperimentStatus.RUNNING, started_at=utcnow())
            self._exps[exp.id] = exp
            return exp

    def claim_next(self, sweep_id: int | None = None) -> Experiment | None:
        with self._lock:
            queued = self._select(sweep_id, [ExperimentStatus.QUEUED])
            queued.sort(key=lambda e: (-e.priority, e.id))
            return self.claim(queued[0].id) if queued else None

    def mark_started(self, experiment_id: int, **fields: object) -> None:
        with self._lock:
            exp = self.get_experiment(experiment_id)
            check_started(experiment_id, exp.status, fields)
            given = {k: v for k, v in fields.items() if v is not None}
            self._exps[exp.id] = replace(exp, **given)  # type: ignore[arg-type]

    def finish(self, experiment_id: int, finish: Finish,
               keep_commit: str | None = None) -> Experiment:
        with self._lock:
            exp = self.get_experiment(experiment_id)
            check_finish(experiment_id, exp.status, finish, keeps=keep_commit is not None)
            meta = finished_meta(exp.meta, finish)
            exp = replace(
                exp, status=finish.status, crash_kind=finish.crash_kind, meta=meta,
                summary=dict(finish.summary),
                run_started_at=finish.run_started_at or exp.run_started_at,
                finished_at=utcnow(), commit=keep_commit or exp.commit,
                **{name: getattr(finish, name) for name in FINISH_AS_IS})
            self._exps[exp.id] = exp
            if keep_commit is not None:
                assert finish.best is not None
                self.set_best(exp.sweep_id, exp.id, finish.best, keep_commit,
                              baseline=exp.is_baseline)
            return exp

    def request_cancel(self, experiment_id: int, reason: str) -> bool:
        with self._lock:
            if self.get_experiment(experiment_id).status is not ExperimentStatus.RUNNING:
                return False
            self._cancels[experiment_id] = reason
            return True

    def interrupt_running(self) -> list[Experiment]:
        with self._lock:
            reaped = []
            for exp in self._select(statuses=[ExperimentStatus.RUNNING]):
                status, reason = reaped_end(self._cancels.pop(exp.id, None))
                exp = replace(exp, status=status, reason=reason, finished_at=utcnow())
                self._exps[exp.id] = exp
                reaped.append(exp)
            return reaped

    # --- loss curve ---------------------------------------------------------------------
    def add_loss_points(self, experiment_id: int, points: Sequence[ProgressPoint]) -> None:
        with self._lock:
            self._points.setdefault(experiment_id, []).extend(points)

    def replace_loss_points(self, experiment_id: int, points: Sequence[ProgressPoint]) -> None:
        with self._lock:
            self._points[experiment_id] = list(points)

    def loss_curves(self, experiment_ids: Collection[int]) -> dict[int, list[ProgressPoint]]:
        with self._lock:
            return {i: sorted(self._points.get(i, []), key=lambda p: p.step)
                    for i in experiment_ids}

    # --- gc -----------------------------------------------------------------------------
    def prunable_experiments(self, finished_before: datetime,
                             statuses: Sequence[ExperimentStatus], limit: int,
                             after_id: int = 0) -> list[Experiment]:
        wanted = {s for s in statuses if s.is_finished()}
        with self._lock:
            found = [e for _, e in sorted(self._exps.items())
                     if e.status in wanted and e.pruned_at is None and e.id > after_id
                     and e.finished_at is not None and e.finished_at < finished_before]
            return found[:limit]

    def prune_experiments(self, pruned: Mapping[int, Pruned]) -> None:
        with self._lock:
            for exp_id in pruned:
                exp = self.get_experiment(exp_id)
                if not exp.status.is_finished():
                    raise ConflictError(f"experiment {exp_id} is {exp.status.value}: only "
                                        "finished experiments are pruned")
            now = utcnow()
            for exp_id, (points, note) in pruned.items():
                self._points[exp_id] = list(points)
                for run in self.list_runs(experiment_id=exp_id):
                    self._runs[run.id] = replace(run, log_path=None)
                exp = self._exps[exp_id]
                self._exps[exp_id] = replace(exp, log_path=None, pruned_at=now,
                                             meta={**exp.meta, "pruned": dict(note)})

    # --- runs ---------------------------------------------------------------------------
    def start_run(self, spec: RunSpec) -> Run:
        with self._lock:
            self.get_experiment(spec.experiment_id)
            run = Run(
                id=len(self._runs) + 1, sweep_id=spec.sweep_id, experiment_id=spec.experiment_id,
                commit=spec.commit, seed=spec.seed, role=spec.role, status=RunStatus.RUNNING,
                log_path=spec.log_path, device=spec.device, pair_run_id=spec.pair_run_id,
                started_at=utcnow())
            self._runs[run.id] = run
            return run

    def _run(self, run_id: int) -> Run:
        run = self._runs.get(run_id)
        if run is None:
            raise NotFoundError(f"no run with id {run_id}")
        return run

    def set_run_pgid(self, run_id: int, pgid: int) -> None:
        with self._lock:
            self._runs[run_id] = replace(self._run(run_id), pgid=pgid)

    def set_run_job(self, run_id: int, job_id: str) -> None:
        with self._lock:
            self._runs[run_id] = replace(self._run(run_id), slurm_job_id=job_id)

    def end_run(self, run_id: int, end: RunEnd) -> Run:
        with self._lock:
            run = self._run(run_id)
            if run.status is not RunStatus.RUNNING:
                raise ConflictError(f"run {run_id} already ended ({run.status.value})")
            run = replace(
                run, status=end.status, metric=end.metric, summary=dict(end.summary),
                throughput=end.throughput, throughput_unit=end.throughput_unit,
                training_s=end.training_s, total_s=end.total_s,
                throughput_source=end.throughput_source, holdout=end.holdout,
                ended_at=utcnow(),
                note=run.note if end.note is None else end.note[:500] or None,
                curve=end.curve or None, stop_fraction=end.stop_fraction)
            self._runs[run_id] = run
            return run

    def set_run_status(self, run_id: int, status: RunStatus, note: str | None = None) -> None:
        allowed = (RunStatus.OK, RunStatus.SUSPECT)
        with self._lock:
            run = self._run(run_id)
            if run.status not in allowed or status not in allowed:
                raise ConflictError(f"run {run_id} is {run.status.value}; cannot become "
                                    f"{status.value}")
            self._runs[run_id] = replace(
                run, status=status, note=run.note if note is None else note[:500] or None)

    def list_runs(self, sweep_id: int | None = None, experiment_id: int | None = None
                  ) -> list[Run]:
        with self._lock:
            return [r for _, r in sorted(self._runs.items())
                    if (sweep_id is None or r.sweep_id == sweep_id)
                    and (experiment_id is None or r.experiment_id == experiment_id)]

    def run_log_paths(self, experiment_ids: Collection[int]) -> dict[int, list[str]]:
        wanted, out = set(experiment_ids), dict[int, list[str]]()
        with self._lock:
            for _, r in sorted(self._runs.items()):
                if r.experiment_id in wanted and r.log_path is not None:
                    out.setdefault(r.experiment_id, []).append(r.log_path)
        return out

    def interrupt_running_runs(self) -> list[Run]:
        with self._lock:
            reaped = []
            for run in self.list_runs():
                if run.status is RunStatus.RUNNING:
                    run = replace(run, status=RunStatus.INTERRUPTED, ended_at=utcnow())
                    self._runs[run.id] = run
                    reaped.append(run)
            return reaped


def _implements_the_port(store: MemoryStore) -> Store:
    """mypy checks here that MemoryStore has every method of the Store port."""
    return store


def _within(when: datetime | None, since: datetime | None, until: datetime | None) -> bool:
    """`when` in [since, until) (None: that side is open)."""
    if since is None and until is None:
        return True
    return when is not None and (since is None or when >= since) and (
        until is None or when < until)
