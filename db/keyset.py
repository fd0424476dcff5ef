"""Keyset pages over the experiments table: filters as an index's equality prefix, then `id`.

A page is `WHERE <filters> AND id < before (or > after) ORDER BY id LIMIT n`. Each filter
combination the API and dashboard offer has an index of its columns followed by `id` (models.py,
migration keyset_pages), so the database walks the index from the cursor and stops after `n`
entries: a page costs the page, not the table. Several statuses at once (`status IN (...)`)
cannot be read in `id` order from one index range, so a limited page runs one query per status
(each reads at most `n` rows) and merges them here: k statuses cost k pages, never a scan.

The time filter (`since` ≤ created_at < `until`) is on `created_at`, the time a row is written,
which follows `id`: a time window is one id range of the same listing, so the walk stays on the
filter's (…, id) index. The range's ends come from ix_experiments_created (created_at, id), one
seek each, read just before the page (same transaction) and given to it as numbers (a bound the
planner cannot see misleads PostgreSQL): `id` above the last row created before
`since - CLOCK_SLACK` and below the first created at or after `until + CLOCK_SLACK`; the exact
`created_at` test is applied too. Writers stamp `created_at` just before their INSERT, so two
concurrent ones (or a clock stepped back) can stamp out of id order; the slack keeps such rows
inside the walked range, and costs the rows written in that minute, not the table (a row out
of order by more than the slack, next to a bound, can be missed). The walk is bounded: from the
cursor (or the window's upper id) down the filter's index, it stops after `n` matches or at the
window's lower id. PostgreSQL may instead read a narrow window's rows on the time index and
sort them (its cost model's choice: the window's rows, still not the table).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, select
from sqlalchemy.orm import Session

from agent.core.domain import CrashKind, ExperimentStatus
from db.models import ExperimentRow

E = ExperimentRow
# How far out of id order two rows' created_at may be and still be found (see above).
CLOCK_SLACK = timedelta(minutes=1)
NO_ID, LAST_ID = 0, 2**63 - 1


@dataclass(frozen=True)
class Page:
    sweep_id: int | None = None
    statuses: Sequence[ExperimentStatus] | None = None
    crash_kind: CrashKind | None = None
    before_id: int | None = None
    after_id: int | None = None
    newest_first: bool = False
    limit: int | None = None
    since: datetime | None = None
    until: datetime | None = None

    def statements(self, base: Select[Any], ids: tuple[int, int] = (NO_ID, LAST_ID)
                   ) -> list[Select[Any]]:
        """The page's queries on `base` (one per status when they must be merged); `ids`: the
        time window's id range (`window_ids`), exclusive at both ends."""
        wanted = list(dict.fromkeys(self.statuses or ()))
        if len(wanted) > 1 and self.limit is not None:
            return [self._one(base, [st], ids) for st in wanted]
        return [self._one(base, wanted, ids)]

    def _one(self, q: Select[Any], statuses: list[ExperimentStatus], ids: tuple[int, int]
             ) -> Select[Any]:
        if self.sweep_id is not None:
            q = q.where(E.sweep_id == self.sweep_id)
        if len(statuses) == 1:
            q = q.where(E.status == statuses[0].value)
        elif statuses:
            q = q.where(E.status.in_([st.value for st in statuses]))
        if self.crash_kind is not None:
            q = q.where(E.crash_kind == self.crash_kind.value)
        if self.before_id is not None:
            q = q.where(E.id < self.before_id)
        if self.after_id is not None:
            q = q.where(E.id > self.after_id)
        q = q.where(*self._window(ids))
        q = q.order_by(E.id.desc() if self.newest_first else E.id)
        return q if self.limit is None else q.limit(self.limit)

    def window_ids(self, s: Session) -> tuple[int, int]:
        """The time window's id range, exclusive at both ends, each end one seek on the time
        index. Read before the page and given to it as numbers: a planner that sees a bound as
        a subquery guesses its selectivity (PostgreSQL took a third of the table and walked the
        primary key instead of the filter's index)."""
        low, high = NO_ID, LAST_ID
        if self.since is not None:
            edge = _shifted(self.since.astimezone(UTC), -CLOCK_SLACK)
            low = s.scalar(select(E.id).where(E.created_at < edge)
                           .order_by(E.created_at.desc(), E.id.desc()).limit(1)) or NO_ID
        if self.until is not None:
            edge = _shifted(self.until.astimezone(UTC), CLOCK_SLACK)
            high = s.scalar(select(E.id).where(E.created_at >= edge)
                            .order_by(E.created_at, E.id).limit(1)) or LAST_ID
        return low, high

    def _window(self, ids: tuple[int, int]) -> list[ColumnElement[bool]]:
        """The time filter: its id range and the exact test."""
        out: list[ColumnElement[bool]] = []
        if self.since is not None:
            out += [E.id > ids[0], E.created_at >= self.since.astimezone(UTC)]
        if self.until is not None:
            out += [E.id < ids[1], E.created_at < self.until.astimezone(UTC)]
        return out

    def rows(self, s: Session, base: Select[Any], *, entities: bool = True) -> list[Any]:
        """Run the page on `base`: ORM rows for `select(ExperimentRow)` (`entities`), else
        result rows of the columns it selects (each must include `id`)."""
        ids = self.window_ids(s)
        parts = [list(s.scalars(q) if entities else s.execute(q))
                 for q in self.statements(base, ids)]
        if len(parts) == 1:
            return parts[0]
        merged = sorted((r for part in parts for r in part), key=_id_of,
                        reverse=self.newest_first)
        return merged if self.limit is None else merged[: self.limit]


def _shifted(when: datetime, by: timedelta) -> datetime:
    """`when + by`, or `when` itself at the edge of representable time."""
    try:
        return when + by
    except OverflowError:
        return when


def _id_of(row: Any) -> int:
    return int(row.id)
