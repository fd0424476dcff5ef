"""Keyset pages over the experiments table: filters as an index's equality prefix, then `id`.

A page is `WHERE <filters> AND id < before (or > after) ORDER BY id LIMIT n`. Each filter
combination the API and dashboard offer has an index of its columns followed by `id` (models.py,
migration keyset_pages), so the database walks the index from the cursor and stops after `n`
entries: a page costs the page, not the table. Several statuses at once (`status IN (...)`)
cannot be read in `id` order from one index range, so a limited page runs one query per status
(each reads at most `n` rows) and merges them here: k statuses cost k pages, never a scan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select
from sqlalchemy.orm import Session

from agent.domain import CrashKind, ExperimentStatus
from db.models import ExperimentRow

E = ExperimentRow


@dataclass(frozen=True)
class Page:
    sweep_id: int | None = None
    statuses: Sequence[ExperimentStatus] | None = None
    crash_kind: CrashKind | None = None
    before_id: int | None = None
    after_id: int | None = None
    newest_first: bool = False
    limit: int | None = None

    def statements(self, base: Select[Any]) -> list[Select[Any]]:
        """The page's queries on `base` (one per status when they must be merged)."""
        wanted = list(dict.fromkeys(self.statuses or ()))
        if len(wanted) > 1 and self.limit is not None:
            return [self._one(base, [st]) for st in wanted]
        return [self._one(base, wanted)]

    def _one(self, q: Select[Any], statuses: list[ExperimentStatus]) -> Select[Any]:
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
        q = q.order_by(E.id.desc() if self.newest_first else E.id)
        return q if self.limit is None else q.limit(self.limit)

    def rows(self, s: Session, base: Select[Any], *, entities: bool = True) -> list[Any]:
        """Run the page on `base`: ORM rows for `select(ExperimentRow)` (`entities`), else
        result rows of the columns it selects (each must include `id`)."""
        parts = [list(s.scalars(q) if entities else s.execute(q))
                 for q in self.statements(base)]
        if len(parts) == 1:
            return parts[0]
        merged = sorted((r for part in parts for r in part), key=_id_of,
                        reverse=self.newest_first)
        return merged if self.limit is None else merged[: self.limit]


def _id_of(row: Any) -> int:
    return int(row.id)
