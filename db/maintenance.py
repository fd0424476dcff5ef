"""Database sizes and VACUUM for `overnight gc`, per dialect.

SQLite: the file (with its -wal) is the size; space freed by deletes stays in the file as free
pages until VACUUM rewrites it, which gc runs only when it pays (enough free pages). PostgreSQL:
`pg_database_size`; its autovacuum reuses freed space in place and a full VACUUM would lock
every table, so gc never runs one there.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, text

from agent.core.errors import StoreError

logger = logging.getLogger(__name__)
VACUUM_MIN_FREE_BYTES = 1024 * 1024  # below this a rewrite gains nothing worth its cost
VACUUM_MIN_FREE_SHARE = 0.10  # ... nor when under a tenth of the file is free


@dataclass(frozen=True)
class DatabaseSize:
    total_bytes: int  # the database on disk (SQLite: file + -wal)
    free_bytes: int  # reclaimable by VACUUM (SQLite free pages; 0 elsewhere)
    tables: dict[str, int]  # bytes per table (indexes included), where the dialect says


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def _sqlite_file(engine: Engine) -> Path:
    return Path(engine.url.database or "")


def _sqlite_tables(engine: Engine) -> dict[str, int]:
    """Bytes per table and its indexes, from the dbstat table (empty where it is missing)."""
    q = text("SELECT coalesce(m.tbl_name, d.name), SUM(d.pgsize) FROM dbstat d "
             "LEFT JOIN sqlite_master m ON m.name = d.name GROUP BY 1")
    try:
        with engine.connect() as conn:
            return {str(name): int(size) for name, size in conn.execute(q)}
    except Exception:  # noqa: BLE001 - SQLite built without the dbstat table
        return {}


def database_size(engine: Engine) -> DatabaseSize:
    if is_sqlite(engine):
        path = _sqlite_file(engine)
        total = sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal"))
                    if p.exists())
        with engine.connect() as conn:
            free = conn.exec_driver_sql("PRAGMA freelist_count").scalar_one()
            page = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
        return DatabaseSize(total, int(free) * int(page), _sqlite_tables(engine))
    with engine.connect() as conn:
        total = conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
        rows = conn.execute(text(
            "SELECT relname, pg_total_relation_size(relid) FROM pg_catalog.pg_statio_user_tables"))
        return DatabaseSize(int(total), 0, {str(n): int(b) for n, b in rows})


def vacuum_pays(size: DatabaseSize) -> bool:
    return (size.free_bytes >= VACUUM_MIN_FREE_BYTES
            and size.free_bytes >= VACUUM_MIN_FREE_SHARE * max(size.total_bytes, 1))


def vacuum(engine: Engine) -> bool:
    """Rewrite a SQLite database without its free pages (and empty the WAL); False (nothing
    done) on other dialects. Waits for other writers (busy timeout) while it runs."""
    if not is_sqlite(engine):
        return False
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.commit()
        raw = conn.connection.dbapi_connection
        assert raw is not None
        try:
            raw.execute("VACUUM")  # outside any transaction, as SQLite requires
            raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:  # busy past the timeout (a long reader), disk full
            raise StoreError(f"VACUUM of {_sqlite_file(engine)} failed: {exc}") from None
    logger.info("VACUUM done on %s", _sqlite_file(engine))
    return True


def checkpoint(engine: Engine) -> None:
    """Fold the SQLite WAL into the file (so its size is the data's); nothing elsewhere."""
    if is_sqlite(engine):
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.commit()
