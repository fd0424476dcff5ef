"""A sweep's experiments and runs with only the fields its plot and evidence need.

A sweep page with 10,000 experiments cannot afford full rows (diffs, summaries, logs, five
timestamps each): these read a handful of columns as plain tuples, without ORM objects, and
build the domain records from them.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import DateTime, Select, func, select, type_coerce

from agent.core.domain import CrashKind, Experiment, ExperimentStatus, Run, RunRole, RunStatus
from db.models import ExperimentCountRow, ExperimentRow, RunCountRow, RunRow
from db.rows import utc
from db.session import StoreBase

E, R, N = ExperimentRow, RunRow, RunCountRow
# Enum(value) is a slow call; 30,000 of them were a third of a 10,000-experiment page.
STATUS = {s.value: s for s in ExperimentStatus}
KIND = {k.value: k for k in CrashKind}
ROLE = {r.value: r for r in RunRole}
RUN_STATUS = {r.value: r for r in RunStatus}
FINISHED = sorted(s.value for s in ExperimentStatus if s.is_finished())
# The run times as plain DateTime: UTCDateTime's per-value hook was most of the query's time;
# the UTC zone is put back below, in the one loop that builds the records.
MARK_COLUMNS = (E.id, E.status, E.crash_kind, E.metric, E.best_before, E.description,
                E.is_baseline, E.commit, E.base_commit, type_coerce(E.run_started_at, DateTime),
                type_coerce(E.run_ended_at, DateTime))


def _newer(q: Any, sweep_id: int, after_id: int | None, ids: Collection[int],
           key: Any, ident: Any) -> list[Select[Any]]:
    """The statements reading the sweep's rows with id > after_id (all without it) and the
    rows `ids`: one index range each (sweep, id) and one primary-key lookup, never a scan."""
    if after_id is None and not ids:
        return [q.where(key == sweep_id).order_by(ident)]
    out = [] if after_id is None else [q.where(key == sweep_id, ident > after_id)
                                       .order_by(ident)]
    if ids:
        out.append(q.where(ident.in_(sorted(ids)), key == sweep_id).order_by(ident))
    return out


def _rows(s: Any, statements: list[Select[Any]]) -> list[Any]:
    if len(statements) == 1:
        return list(s.execute(statements[0]))
    rows = {row[0]: row for q in statements for row in s.execute(q)}  # an id in both: once
    return [rows[i] for i in sorted(rows)]


class SweepMarks(StoreBase):
    def experiment_marks(self, sweep_id: int, with_diffs: bool = False,
                         after_id: int | None = None, ids: Collection[int] = ()
                         ) -> list[Experiment]:
        """The sweep's experiments, oldest first: id, status, crash kind, metric, best before,
        description, baseline flag, commits and run times (`with_diffs`: diff and reason too);
        summary and meta empty. With `after_id` or `ids`: only those after it and those."""
        extra = (E.diff, E.reason) if with_diffs else ()
        statements = _newer(select(*MARK_COLUMNS, *extra), sweep_id, after_id, ids,
                            E.sweep_id, E.id)
        with self.session("reading a sweep's plot") as s:
            rows = _rows(s, statements)
        return [Experiment(id=i, sweep_id=sweep_id, status=STATUS[st],
                           crash_kind=KIND[ck] if ck else None, metric=m, best_before=bb,
                           description=d, diff=more[0] if more else "", proposer="",
                           reason=more[1] if more else None, is_baseline=bool(base),
                           commit=c, base_commit=bc, run_started_at=utc(rs),
                           run_ended_at=utc(re))
                for i, st, ck, m, bb, d, base, c, bc, rs, re, *more in rows]

    def run_metrics(self, sweep_id: int, after_id: int | None = None,
                    ids: Collection[int] = ()) -> list[Run]:
        """The sweep's runs by id with id, experiment, commit, seed, role, status, metric and
        throughput only (what the sweep's evidence and each keep decision are computed from).
        With `after_id` or `ids`: only those after it and those."""
        statements = _newer(select(R.id, R.experiment_id, R.commit, R.seed, R.role, R.status,
                                   R.metric, R.throughput), sweep_id, after_id, ids, R.sweep_id,
                            R.id)
        with self.session("reading a sweep's run metrics") as s:
            rows = _rows(s, statements)
        return [Run(id=i, sweep_id=sweep_id, experiment_id=e, commit=c, seed=sd,
                    role=ROLE[role], status=RUN_STATUS[st], metric=m, throughput=t)
                for i, e, c, sd, role, st, m, t in rows]

    def sweep_version(self, sweep_id: int) -> tuple[Any, Any]:
        """(experiments, runs): the first changes whenever one of the sweep's experiments
        reaches a finished status, the second whenever one of its runs ends or changes verdict
        (see the port): counts per finished status of its experiments, and per ended status of
        its runs with their highest id."""
        C = ExperimentCountRow
        with self.session("reading a sweep's version") as s:
            exps = s.execute(select(C.status, C.crash_kind, C.n)
                             .where(C.sweep_id == sweep_id, C.status.in_(FINISHED), C.n != 0)
                             .order_by(C.status, C.crash_kind)).all()
            # The maintained counts (db/counts.py bump_runs), each status's highest id one
            # seek in ix_runs_sweep_status: no pass over the sweep's runs.
            top = (select(func.max(R.id)).where(R.sweep_id == N.sweep_id, R.status == N.status)
                   .scalar_subquery())
            runs = s.execute(select(N.status, N.n, top)
                             .where(N.sweep_id == sweep_id, N.n != 0,
                                    N.status != RunStatus.RUNNING.value)
                             .order_by(N.status)).all()
        return tuple(map(tuple, exps)), tuple(map(tuple, runs))
