"""Reading experiments: lists, the dashboard's brief rows, diff lookups, counts, retries."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, bindparam, func, select, type_coerce

from agent.core.domain import RAN_STATUSES, CrashKind, Experiment, ExperimentStatus
from agent.rules.admit import diff_key
from db import counts
from db.keyset import Page
from db.models import ExperimentRow, UTCDateTime
from db.rows import BRIEF_FIELDS, to_experiment, utc
from db.session import StoreBase

# The duplicate check, on every proposal: the id alone first (one search of
# ix_experiments_sweep_diff), as the usual answer is "none" and the row is only loaded for the
# refusal's message. Built once (values bound at execute): building it cost as much as running it.
_DIFF_LOOKUP = (
    select(ExperimentRow.id)
    .where(
        ExperimentRow.sweep_id == bindparam("sweep_id"),
        ExperimentRow.diff_key == bindparam("diff_key"),
        ExperimentRow.status != ExperimentStatus.REJECTED.value,
    )
    .order_by(ExperimentRow.id)
    .limit(1)
)

# Timestamps read as plain DateTime (UTCDateTime's per-value hook was half the read) and made
# aware again in the loop that builds the records.
BRIEF_TIMES = [f for f in BRIEF_FIELDS if isinstance(getattr(ExperimentRow, f).type, UTCDateTime)]
BRIEF_COLUMNS = [type_coerce(getattr(ExperimentRow, f), DateTime) if f in BRIEF_TIMES
                 else getattr(ExperimentRow, f) for f in BRIEF_FIELDS]


RUN_STATUSES = RAN_STATUSES


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


class ExperimentReads(StoreBase):
    def list_experiments(
        self,
        sweep_id: int | None = None,
        statuses: Sequence[ExperimentStatus] | None = None,
        limit: int | None = None,
        newest_first: bool = False,
        before_id: int | None = None,
        crash_kind: CrashKind | None = None,
        after_id: int | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[Experiment]:
        """A keyset page: each query is one index's equality prefix then an `id` range
        (db/keyset.py), so a page of `limit` rows reads about `limit` rows per status; a time
        window narrows that id range (found on ix_experiments_created)."""
        page = Page(sweep_id, statuses, crash_kind, before_id, after_id, newest_first, limit,
                    since, until)
        with self.session("listing experiments") as s:
            return [to_experiment(r) for r in page.rows(s, select(ExperimentRow))]

    def experiment_briefs(self, sweep_id: int) -> list[Experiment]:
        """The sweep's experiments, oldest first, with `log_tail` None and `meta` empty: only
        the columns the pages use (a log tail is kilobytes; a sweep page lists thousands)."""
        q = select(*BRIEF_COLUMNS).where(ExperimentRow.sweep_id == sweep_id).order_by(
            ExperimentRow.id)
        with self.session("listing a sweep's experiments") as s:
            return _briefs(s.execute(q))

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
            E.sweep_id == sweep_id, E.status.in_([st.value for st in RUN_STATUSES]),
            E.id <= experiment_id)
        with self.session("numbering a run") as s:
            return int(s.scalar(q) or 0)

    def run_spans(self) -> list[tuple[int, ExperimentStatus, datetime | None, datetime | None]]:
        """(sweep id, status, run started, run ended) of every experiment, in one query."""
        q = select(ExperimentRow.sweep_id, ExperimentRow.status, ExperimentRow.run_started_at,
                   ExperimentRow.run_ended_at)
        with self.session("summarising sweeps") as s:
            return [(sid, ExperimentStatus(st), a, b) for sid, st, a, b in s.execute(q)]

    def run_seconds(self) -> dict[int, float]:
        """Per sweep, the seconds from run start to run end summed over its experiments whose
        run has ended: from the maintained counts (a few rows per sweep)."""
        with self.session("summing run times") as s:
            return {sid: total for sid, total in counts.run_seconds(s).items()}

    def status_counts_by_sweep(self) -> dict[int, dict[str, int]]:
        """Experiments per sweep and status (statuses with none left out), from the counts."""
        with self.session("counting experiments") as s:
            return counts.by_sweep(s)

    def has_diff(self, sweep_id: int, diff: str) -> Experiment | None:
        key = diff_key(diff)
        if key is None:
            return None
        with self.session("looking up a diff") as s:
            found = s.scalar(_DIFF_LOOKUP, {"sweep_id": sweep_id, "diff_key": key})
            row = s.get(ExperimentRow, found) if found is not None else None
            return to_experiment(row) if row else None

    def timestamps(self, sweep_id: int) -> list[tuple[datetime | None, datetime | None]]:
        q = (
            select(ExperimentRow.run_started_at, ExperimentRow.run_ended_at)
            .where(ExperimentRow.sweep_id == sweep_id)
            .order_by(ExperimentRow.id)
        )
        with self.session("reading run times") as s:
            return [(a, b) for a, b in s.execute(q)]

    def count_experiments(
        self,
        sweep_id: int | None = None,
        statuses: Sequence[ExperimentStatus] | None = None,
        crash_kind: CrashKind | None = None,
        is_baseline: bool | None = None,
    ) -> int:
        """How many experiments match; every filter is optional (None = any). Without
        `is_baseline` the answer is a sum over the maintained counts (db/counts.py)."""
        if is_baseline is None:
            with self.session("counting experiments") as s:
                return counts.total(s, sweep_id, statuses, crash_kind)
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
        """Experiments per status, of one sweep or the whole database (maintained counts)."""
        with self.session("counting experiments") as s:
            return counts.by_status(s, sweep_id)

    def retry_of(self, experiment_id: int) -> Experiment | None:
        """The row re-queued for an interrupted experiment, if any."""
        q = select(ExperimentRow).where(ExperimentRow.retry_of == experiment_id)
        with self.session("looking up a retry") as s:
            row = s.scalar(q)
            return to_experiment(row) if row is not None else None
