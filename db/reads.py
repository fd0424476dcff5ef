"""The dashboard's and the CLI's reads: page-shaped queries beside the Store, not on its port.

The engine and the use cases talk to the database through the Store port (agent.core.ports);
what only a page or a command prints — neighbours and retries of an experiment, a sweep's plot
marks and version, counts per sweep, loss curves, the trackers' progress — is read here.
`Reads(store)` runs inside the store's sessions, so `with store.reading():` covers its reads
too.

How far behind each experiment tracker is on a sweep (the mirror's ledger, db.track_marks), for
the dashboard's sweep page and `overnight status`: a tracker is behind by the finished
experiments it has not been sent, read off the maintained counts (experiment_counts) and the
ledger's rows, not a scan of the experiments.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, func, select, type_coerce
from sqlalchemy.orm import Session

from agent.analysis.counts import Counts
from agent.core.domain import (
    RAN_STATUSES,
    CrashKind,
    Experiment,
    ExperimentStatus,
    RunRole,
    RunStatus,
)
from agent.core.record import RECORD_KEYS
from db import counts
from db.marks import newer_rows, read_rows
from db.models import (
    ExperimentCountRow,
    ExperimentRow,
    LossPointRow,
    RunCountRow,
    RunRow,
    SweepRow,
    TrackExperimentRow,
    TrackSweepRow,
    UTCDateTime,
)
from db.rows import BRIEF_FIELDS, sweep_config, utc
from db.store import SqlStore
from runner.summary import ProgressPoint


# --- a read model's access to the store's engine and sessions ---------------------------------
class ReadsBase:
    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.engine = store.engine

    def session(self, action: str) -> AbstractContextManager[Session]:
        """The store's transaction helper (inside `store.reading()`, that block's session)."""
        return self.store.session(action)

    def reading(self) -> AbstractContextManager[None]:
        return self.store.reading()


# --- an experiment page's reads (neighbours, retries, run number), counts and run times -------
# Timestamps read as plain DateTime (UTCDateTime's per-value hook was half the read) and made
# aware again in the loop that builds the records.
BRIEF_TIMES = [f for f in BRIEF_FIELDS if isinstance(getattr(ExperimentRow, f).type, UTCDateTime)]
BRIEF_COLUMNS = [type_coerce(getattr(ExperimentRow, f), DateTime) if f in BRIEF_TIMES
                 else getattr(ExperimentRow, f) for f in BRIEF_FIELDS]


def _briefs(rows: Iterable[Sequence[Any]]) -> list[Experiment]:
    """Experiments from result rows of BRIEF_COLUMNS."""
    out = []
    for row in rows:
        d = dict(zip(BRIEF_FIELDS, row, strict=True))
        for f in BRIEF_TIMES:
            d[f] = utc(d[f])
        d["status"] = ExperimentStatus(d["status"])
        d["crash_kind"] = CrashKind(d["crash_kind"]) if d["crash_kind"] else None
        d["summary"] = dict(d["summary"] or {})
        out.append(Experiment(**d))
    return out


class ExperimentViews(ReadsBase):
    def adjacent_experiments(self, sweep_id: int, experiment_id: int
                             ) -> tuple[Experiment | None, Experiment | None]:
        """The brief rows just before and just after an id in its sweep (two index seeks)."""
        E = ExperimentRow
        q = select(*BRIEF_COLUMNS).where(E.sweep_id == sweep_id).limit(1)
        with self.session("reading neighbouring experiments") as s:
            before = _briefs(s.execute(q.where(E.id < experiment_id).order_by(E.id.desc())))
            after = _briefs(s.execute(q.where(E.id > experiment_id).order_by(E.id)))
        return (before[0] if before else None), (after[0] if after else None)

    def retries_of(self, experiment_id: int) -> list[Experiment]:
        """Brief rows of the experiments whose parent it is, oldest first (index on parent)."""
        q = (select(*BRIEF_COLUMNS).where(ExperimentRow.parent_id == experiment_id)
             .order_by(ExperimentRow.id))
        with self.session("listing retries") as s:
            return _briefs(s.execute(q))

    def run_number(self, sweep_id: int, experiment_id: int) -> int:
        """How many of the sweep's experiments up to this id have used a run (kept, discarded,
        crashed, timeout): a count over the (sweep, status, id) index, no rows read."""
        E = ExperimentRow
        q = select(func.count()).select_from(E).where(
            E.sweep_id == sweep_id, E.status.in_([st.value for st in RAN_STATUSES]),
            E.id <= experiment_id)
        with self.session("numbering a run") as s:
            return int(s.scalar(q) or 0)

    def run_seconds(self) -> dict[int, float]:
        """Per sweep, the seconds from run start to run end summed over its experiments whose
        run has ended: from the maintained counts (a few rows per sweep)."""
        with self.session("summing run times") as s:
            return {sid: total for sid, total in counts.run_seconds(s).items()}

    def status_counts_by_sweep(self) -> dict[int, dict[str, int]]:
        """Experiments per sweep and status (statuses with none left out), from the counts."""
        with self.session("counting experiments") as s:
            return counts.by_sweep(s)

    def night_counts(self, sweep_ids: Collection[int]) -> dict[int, Counts]:
        """Each sweep's counts as every screen defines them (agent.analysis.counts): from the
        maintained counts of experiments and runs, its baseline's latest row and its re-runs."""
        ids = list(sweep_ids)
        if not ids:
            return {}
        with self.session("counting a night") as s:
            by_status = counts.by_sweep(s)
            runs: dict[int, dict[str, int]] = {}
            for sweep_id, status, n in s.execute(select(N.sweep_id, N.status, N.n).where(
                    N.sweep_id.in_(ids))):
                runs.setdefault(sweep_id, {})[status] = int(n)
            latest = select(E.sweep_id, func.max(E.id)).where(
                E.is_baseline.is_(True), E.sweep_id.in_(ids)).group_by(E.sweep_id).subquery()
            baseline = dict(s.execute(select(E.sweep_id, E.status).join(
                latest, E.id == latest.c[1])).all())
            reruns = dict(s.execute(select(R.sweep_id, func.count()).where(
                R.sweep_id.in_(ids), R.role == RunRole.INCUMBENT.value,
                R.metric.is_not(None)).group_by(R.sweep_id)).all())
        return {i: Counts.of(by_status.get(i, {}), STATUS[baseline[i]] if i in baseline else None,
                             runs.get(i, {}), int(reruns.get(i, 0)))
                for i in ids}

    def timestamps(self, sweep_id: int) -> list[tuple[datetime | None, datetime | None]]:
        q = (
            select(ExperimentRow.run_started_at, ExperimentRow.run_ended_at)
            .where(ExperimentRow.sweep_id == sweep_id)
            .order_by(ExperimentRow.id)
        )
        with self.session("reading run times") as s:
            return [(a, b) for a, b in s.execute(q)]

    def status_counts(self, sweep_id: int | None = None) -> dict[str, int]:
        """Experiments per status, of one sweep or the whole database (maintained counts)."""
        with self.session("counting experiments") as s:
            return counts.by_status(s, sweep_id)

    def loss_points(self, experiment_id: int) -> list[ProgressPoint]:
        q = (
            select(LossPointRow)
            .where(LossPointRow.experiment_id == experiment_id)
            .order_by(LossPointRow.step, LossPointRow.id)
        )
        with self.session("reading loss points") as s:
            return [ProgressPoint(r.step, r.loss, r.elapsed_s) for r in s.scalars(q)]


# --- a sweep's plot marks and version and sweep names, for the pages and lists ----------------
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
    """An experiment's meta cut down to its record (agent.core.record; the light rows carry no
    more): the verdict, or, on rows from before it, the keep rule's test and early stop."""
    if not isinstance(meta, dict):
        return {}
    return {k: meta[k] for k in RECORD_KEYS if isinstance(meta.get(k), dict)}


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
        return {i: name for i, (name, _) in self.sweep_heads(ids).items()}

    def sweep_heads(self, ids: Collection[int]) -> dict[int, tuple[str, tuple[str, ...]]]:
        """The sweeps' names and `[target] secondary` keys, in one read (an API page's)."""
        if not ids:
            return {}
        q = select(SweepRow.id, SweepRow.name, SweepRow.config).where(
            SweepRow.id.in_(list(ids)))
        with self.session("reading sweep names") as s:
            return {i: (name, sweep_config(config).secondary)
                    for i, name, config in s.execute(q)}


# --- the trackers' progress -------------------------------------------------------------------
TS, TE = TrackSweepRow, TrackExperimentRow


@dataclass(frozen=True)
class TrackProgress:
    """One tracker's hold on one sweep."""

    destination: str
    mirrored: int  # experiments it holds
    behind: int  # finished experiments it does not hold yet
    closed: bool  # the sweep's run was ended (its final numbers sent)
    error: str | None  # what the last sync stopped on (None: it went through)
    failing_since: datetime | None
    updated_at: datetime

    @property
    def up_to_date(self) -> bool:
        return self.behind == 0 and self.error is None

    def line(self) -> str:
        """One line for a page or a terminal."""
        if self.up_to_date:
            return f"{self.destination}: up to date ({self.mirrored} experiments)"
        why = f"; last error: {self.error}" if self.error else ""
        return (f"{self.destination}: behind by {self.behind} experiment(s), "
                f"{self.mirrored} mirrored{why}")


class TrackViews(ReadsBase):
    def track_progress(self, sweep_id: int) -> list[TrackProgress]:
        """Each tracker that holds (or tried to hold) the sweep, with how far behind it is."""
        with self.session("reading the trackers' progress") as s:
            rows = s.execute(select(TS).where(TS.sweep_id == sweep_id)
                             .order_by(TS.destination)).scalars().all()
            if not rows:
                return []
            held = {d: int(n) for d, n in s.execute(
                select(TE.destination, func.count()).where(TE.sweep_id == sweep_id)
                .group_by(TE.destination)).all()}
            finished = int(s.execute(
                select(func.coalesce(func.sum(ExperimentCountRow.n), 0))
                .where(ExperimentCountRow.sweep_id == sweep_id,
                       ExperimentCountRow.status.in_(FINISHED))).scalar_one())
        return [TrackProgress(r.destination, held.get(r.destination, 0),
                              max(0, finished - held.get(r.destination, 0)), bool(r.closed),
                              r.error, r.failing_since, r.updated_at) for r in rows]


# --- every read model over one SqlStore -------------------------------------------------------
class Reads(ExperimentViews, SweepViews, TrackViews):
    """Every read model over one SqlStore."""


