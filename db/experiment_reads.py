"""Reading experiments for the engine: keyset lists, the duplicate lookup, counts, retries."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import bindparam, func, select

from agent.core.domain import CrashKind, Experiment, ExperimentStatus
from agent.rules.admit import diff_key
from db import counts
from db.keyset import Page
from db.models import ExperimentRow
from db.rows import to_experiment
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

    def has_diff(self, sweep_id: int, diff: str) -> Experiment | None:
        key = diff_key(diff)
        if key is None:
            return None
        with self.session("looking up a diff") as s:
            found = s.scalar(_DIFF_LOOKUP, {"sweep_id": sweep_id, "diff_key": key})
            row = s.get(ExperimentRow, found) if found is not None else None
            return to_experiment(row) if row else None

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

    def retry_of(self, experiment_id: int) -> Experiment | None:
        """The row re-queued for an interrupted experiment, if any."""
        q = select(ExperimentRow).where(ExperimentRow.retry_of == experiment_id)
        with self.session("looking up a retry") as s:
            row = s.scalar(q)
            return to_experiment(row) if row is not None else None
