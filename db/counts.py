"""Maintained experiment counts (table experiment_counts): bumped in the writer's transaction.

Every write that inserts an experiment or changes its status or crash kind calls `bump` in the
same session, so the counts commit or roll back with the row itself and a page's total is a
sum over a few small rows, never a COUNT(*) over the experiments table. `rebuild` recomputes
them from the rows (the migration that made the table, and bulk loaders that bypass the
store). Dialect-neutral: an upsert on SQLite and PostgreSQL (both have ON CONFLICT), an
update-then-insert elsewhere.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from sqlalchemy import Connection, delete, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from agent.domain import CrashKind, ExperimentStatus
from db.models import ExperimentCountRow, ExperimentRow

Key = tuple[int, str, str]  # (sweep id, status, crash kind or "")
C = ExperimentCountRow


def key(sweep_id: int, status: str, crash_kind: str | None) -> Key:
    return (sweep_id, status, crash_kind or "")


def bump(s: Session, gone: Sequence[Key] = (), came: Sequence[Key] = ()) -> None:
    """Count the rows in `came` and stop counting those in `gone` (one key per row).

    Keys are applied in sorted order, so two transactions that lock count rows on PostgreSQL
    always take them in the same order (no deadlock)."""
    delta: Counter[Key] = Counter(came)
    delta.subtract(gone)
    for k in sorted(delta):
        if delta[k]:
            _add(s, k, delta[k])


def _add(s: Session, k: Key, n: int) -> None:
    values = {"sweep_id": k[0], "status": k[1], "crash_kind": k[2], "n": n}
    dialect = s.get_bind().dialect.name
    if dialect in ("sqlite", "postgresql"):
        ins = (sqlite.insert if dialect == "sqlite" else postgresql.insert)(C).values(values)
        s.execute(ins.on_conflict_do_update(index_elements=[C.sweep_id, C.status, C.crash_kind],
                                            set_={"n": C.n + ins.excluded.n}))
        return
    found = s.execute(update(C).where(C.sweep_id == k[0], C.status == k[1],
                                      C.crash_kind == k[2]).values(n=C.n + n))
    if found.rowcount == 0:  # type: ignore[attr-defined]
        s.execute(insert(C).values(values))


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


def rebuild(conn: Connection | Session) -> None:
    """Recount every sweep's experiments from the rows (replaces what the table held)."""
    e = ExperimentRow
    kind = func.coalesce(e.crash_kind, "")
    conn.execute(delete(C))
    conn.execute(insert(C).from_select(
        ["sweep_id", "status", "crash_kind", "n"],
        select(e.sweep_id, e.status, kind, func.count()).group_by(e.sweep_id, e.status, kind)))
