"""A sweep's plot marks and version and sweep names, for the pages and lists."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import DateTime, func, select, type_coerce

from agent.core.domain import (
    STOPPED_KEY,
    TEST_KEY,
    CrashKind,
    Experiment,
    ExperimentStatus,
    RunStatus,
)
from db.marks import newer_rows, read_rows
from db.models import ExperimentCountRow, ExperimentRow, RunCountRow, RunRow, SweepRow
from db.reads.base import ReadsBase
from db.rows import utc

E, R, N = ExperimentRow, RunRow, RunCountRow
# Enum(value) is a slow call; 30,000 of them were a third of a 10,000-experiment page.
STATUS = {s.value: s for s in ExperimentStatus}
KIND = {k.value: k for k in CrashKind}
FINISHED = sorted(s.value for s in ExperimentStatus if s.is_finished())
# The run times as plain DateTime: UTCDateTime's per-value hook was most of the query's time;
# the UTC zone is put back below, in the one loop that builds the records.
MARK_COLUMNS = (E.id, E.status, E.crash_kind, E.metric, E.best_before, E.description,
                E.is_baseline, E.commit, E.base_commit, type_coerce(E.run_started_at, DateTime),
                type_coerce(E.run_ended_at, DateTime), E.meta)


def _test_only(meta: Any) -> dict[str, Any]:
    """An experiment's meta cut down to the keep rule's test and where an early stop ended it
    (the light rows carry no more)."""
    if not isinstance(meta, dict):
        return {}
    return {k: meta[k] for k in (TEST_KEY, STOPPED_KEY) if isinstance(meta.get(k), dict)}


class SweepViews(ReadsBase):
    def experiment_marks(self, sweep_id: int, with_diffs: bool = False,
                         after_id: int | None = None, ids: Collection[int] = ()
                         ) -> list[Experiment]:
        """The sweep's experiments, oldest first: id, status, crash kind, metric, best before,
        description, baseline flag, commits, run times and the keep rule's test (meta holds it
        alone; `with_diffs`: diff and reason too); summary empty. With `after_id` or `ids`: only
        those after it and those."""
        extra = (E.diff, E.reason) if with_diffs else ()
        statements = newer_rows(select(*MARK_COLUMNS, *extra), sweep_id, after_id, ids,
                            E.sweep_id, E.id)
        with self.session("reading a sweep's plot") as s:
            rows = read_rows(s, statements)
        return [Experiment(id=i, sweep_id=sweep_id, status=STATUS[st],
                           crash_kind=KIND[ck] if ck else None, metric=m, best_before=bb,
                           description=d, diff=more[0] if more else "", proposer="",
                           reason=more[1] if more else None, is_baseline=bool(base),
                           commit=c, base_commit=bc, run_started_at=utc(rs),
                           run_ended_at=utc(re), meta=_test_only(meta))
                for i, st, ck, m, bb, d, base, c, bc, rs, re, meta, *more in rows]

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

    def sweep_names(self, ids: Collection[int]) -> dict[int, str]:
        if not ids:
            return {}
        q = select(SweepRow.id, SweepRow.name).where(SweepRow.id.in_(list(ids)))
        with self.session("reading sweep names") as s:
            return {i: name for i, name in s.execute(q)}
