"""Maintained experiment counts and run seconds (table experiment_counts), bumped by writers.

Every write that inserts an experiment or changes its status or crash kind calls `bump` in the
same session (a finish with both run times also adds the run's seconds), so the counts commit
or roll back with the row itself and a page's total is a sum over a few small rows, never a
COUNT(*) over the experiments table. Dialect-neutral: an upsert on
SQLite and PostgreSQL (both have ON CONFLICT), an update-then-insert elsewhere.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import (
    Connection,
    Table,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from agent.core.domain import CrashKind, ExperimentStatus
from db.models import ExperimentCountRow, RunCountRow

Key = tuple[int, str, str]  # (sweep id, status, crash kind or "")
C = ExperimentCountRow
_UPSERTS: dict[tuple[str, str], Any] = {}  # (dialect, table) -> its upsert (see _upsert)


def key(sweep_id: int, status: str, crash_kind: str | None) -> Key:
    return (sweep_id, status, crash_kind or "")


def bump(s: Session, gone: Sequence[Key] = (), came: Sequence[Key] = (),
         run_s: float = 0.0) -> None:
    """Count the rows in `came` and stop counting those in `gone` (one key per row); `run_s`:
    run seconds the (one) row in `came` brings (a finish with both run times).

    Keys are applied in sorted order, so two transactions that lock count rows on PostgreSQL
    always take them in the same order (no deadlock). Finished rows never change status, so a
    row leaving a key never takes run seconds with it."""
    delta: Counter[Key] = Counter(came)
    delta.subtract(gone)
    seconds = {came[0]: run_s} if run_s and len(came) == 1 else {}
    for k in sorted(set(delta) | set(seconds)):
        if delta[k] or seconds.get(k):
            _add(s, k, delta[k], seconds.get(k, 0.0))


def _add(s: Session, k: Key, n: int, run_s: float = 0.0) -> None:
    values = {"sweep_id": k[0], "status": k[1], "crash_kind": k[2], "n": n, "run_s": run_s}
    dialect = s.get_bind().dialect.name
    if dialect in ("sqlite", "postgresql"):
        s.execute(_upsert(dialect, C, ("sweep_id", "status", "crash_kind"), ("n", "run_s")),
                  values)
        return
    found = s.execute(update(C).where(C.sweep_id == k[0], C.status == k[1],
                                      C.crash_kind == k[2])
                      .values(n=C.n + n, run_s=C.run_s + run_s))
    if found.rowcount == 0:  # type: ignore[attr-defined]
        s.execute(insert(C).values(values))


def bump_runs(s: Session, sweep_id: int, gone: str | None, came: str | None,
              n: int = 1) -> None:
    """`n` of the sweep's runs left status `gone` for `came` (None: inserted, or deleted).
    Every write that inserts a run or changes its status calls this in the same session."""
    for status, k in sorted({gone: -n, came: n}.items(), key=lambda x: str(x[0])):
        if status is not None and gone != came:
            _add_runs(s, sweep_id, status, k)


def _add_runs(s: Session, sweep_id: int, status: str, n: int) -> None:
    R = RunCountRow
    values = {"sweep_id": sweep_id, "status": status, "n": n}
    dialect = s.get_bind().dialect.name
    if dialect in ("sqlite", "postgresql"):
        s.execute(_upsert(dialect, R, ("sweep_id", "status"), ("n",)), values)
        return
    found = s.execute(update(R).where(R.sweep_id == sweep_id, R.status == status)
                      .values(n=R.n + n))
    if found.rowcount == 0:  # type: ignore[attr-defined]
        s.execute(insert(R).values(values))


def _upsert(dialect: str, row: Any, keys: tuple[str, ...], sums: tuple[str, ...]) -> Any:
    """The dialect's INSERT ... ON CONFLICT (keys) DO UPDATE adding `sums` on the row's table
    (values bound at execute), built once per dialect and table: building it (its `excluded`
    columns) and the ORM-enabled path of an insert on the entity cost more than the statement
    itself, on every insert of an experiment or run."""
    table = cast(Table, row.__table__)
    stmt = _UPSERTS.get((dialect, table.name))
    if stmt is None:
        ins = (sqlite.insert if dialect == "sqlite" else postgresql.insert)(table)
        stmt = _UPSERTS[(dialect, table.name)] = ins.on_conflict_do_update(
            index_elements=[table.c[k] for k in keys],
            set_={c: table.c[c] + ins.excluded[c] for c in sums})
    return stmt


def total(s: Session, sweep_id: int | None = None,
          statuses: Sequence[ExperimentStatus] | None = None,
          crash_kind: CrashKind | None = None) -> int:
    """How many experiments match (every filter optional), from the counts."""
    q = select(func.coalesce(func.sum(C.n), 0))
    if sweep_id is not None:
        q = q.where(C.sweep_id == sweep_id)
    if statuses:
        q = q.where(C.status.in_([st.value for st in statuses]))
    if crash_kind is not None:
        q = q.where(C.crash_kind == crash_kind.value)
    return int(s.scalar(q) or 0)


def by_status(s: Session, sweep_id: int | None = None) -> dict[str, int]:
    """Experiments per status (statuses with none are left out), from the counts."""
    q = select(C.status, func.sum(C.n)).group_by(C.status)
    if sweep_id is not None:
        q = q.where(C.sweep_id == sweep_id)
    return {status: int(n) for status, n in s.execute(q) if n}


def by_sweep(s: Session) -> dict[int, dict[str, int]]:
    """Experiments per sweep and status (statuses with none are left out), from the counts."""
    out: dict[int, dict[str, int]] = {}
    q = select(C.sweep_id, C.status, func.sum(C.n)).group_by(C.sweep_id, C.status)
    for sweep_id, status, n in s.execute(q):
        if n:
            out.setdefault(sweep_id, {})[status] = int(n)
    return out


def run_seconds(conn: Connection | Session) -> dict[int, float]:
    """Run seconds per sweep (those with experiments), from the counts."""
    q = select(C.sweep_id, func.sum(C.run_s)).group_by(C.sweep_id)
    return {sweep_id: float(total or 0.0) for sweep_id, total in conn.execute(q)}

