"""Engine factory for SQLite (WAL, foreign keys, busy timeout) and PostgreSQL (psycopg 3, a
bounded pool, UTC sessions); migrations on open.

Nothing is created at import time: callers (app factory, CLI) build an engine from a location.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text

from agent.core.private import private_file
from db.location import DbLocation

logger = logging.getLogger(__name__)
BUSY_TIMEOUT_MS = 30_000
CONNECT_TIMEOUT_S = 10
# Advisory lock keys (pg_advisory_lock(int4, int4)): "ovnt" as an int4, then one key per use.
LOCK_CLASS = 0x6F766E74
MIGRATION_LOCK = 2
NUL_STANDIN = "\ufffd"  # what a NUL in text becomes on PostgreSQL (the replacement character)


def _on_connect(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def make_engine(location: DbLocation | Path | str) -> Engine:
    """An engine for a SQLite file (parent folders are created 0700, the file and its
    -wal/-shm companions 0600) or a PostgreSQL database (psycopg 3)."""
    db = DbLocation.parse(location)
    if db.path is None:
        return _postgres_engine(db)
    for companion in ("", "-wal", "-shm"):
        private_file(db.path.with_name(db.path.name + companion))
    engine = create_engine(
        db.url,
        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000},
        pool_size=8,
        max_overflow=16,
    )
    event.listen(engine, "connect", _on_connect)
    return engine


def postgres_connect_args(application_name: str = "overnight") -> dict[str, Any]:
    """Every session in UTC (timestamps are stored naive UTC), a bounded connect wait, and
    every execution planned for its own values: psycopg prepares a statement on its 5th run,
    and the server's generic plan for a list page (one plan for every status) walks the
    primary key filtering rows, which reads the whole table for a rare status
    (tests/test_query_plans.py). Planning a page costs ~0.1 ms; the walk, the table."""
    return {"connect_timeout": CONNECT_TIMEOUT_S, "application_name": application_name,
            "options": "-c timezone=UTC -c plan_cache_mode=force_custom_plan"}


def _postgres_engine(db: DbLocation) -> Engine:
    try:
        import psycopg  # noqa: F401 - only to turn a missing driver into one clear message
    except ImportError:
        raise RuntimeError("a PostgreSQL database needs the psycopg driver: "
                           "pip install 'overnight[postgres]'") from None
    # The engine's slots, the API's threadpool and the scheduler share it; pre-ping drops
    # connections a server restart or an idle timeout closed, instead of failing a request.
    # It is one round trip per checkout (~140 µs on loopback), and a request that reads
    # several things checks out once (Store.reading()), so it stays.
    engine = create_engine(db.url, pool_size=8, max_overflow=16, pool_timeout=30,
                           pool_pre_ping=True, pool_recycle=1800,
                           connect_args=postgres_connect_args())
    event.listen(engine, "before_cursor_execute", _replace_nul, retval=True)
    return engine


def _without_nul(value: Any) -> Any:
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", NUL_STANDIN)
    if isinstance(value, dict):
        return {k: _without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_without_nul(v) for v in value)
    return value


def _replace_nul(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any,
                 _executemany: bool) -> tuple[str, Any]:
    """PostgreSQL text cannot hold NUL; a trainer's binary output in a log tail would fail
    the whole finish (and leave the experiment running). SQLite keeps it as given."""
    return statement, _without_nul(parameters)


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision`, by default the newest (a no-op when already there);
    an older revision is for tests that build a database as an old release left it."""
    from alembic import command
    from alembic.config import Config

    # Alembic narrates every start at INFO ("setup plugin ..."); keep the service log readable.
    logging.getLogger("alembic").setLevel(logging.WARNING)

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    with engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            _migrate_sqlite(conn, cfg, command.upgrade, revision)
            return
        with conn.begin():
            # Two processes opening a fresh database at once would both create the tables;
            # the second waits here (the lock ends with the transaction) and finds them made.
            conn.execute(text("SELECT pg_advisory_xact_lock(:c, :k)"),
                         {"c": LOCK_CLASS, "k": MIGRATION_LOCK})
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)


def _migrate_sqlite(conn: Connection, cfg: Any, upgrade: Any, revision: str) -> None:
    # A batch migration re-creates a table (copy, DROP, rename); with foreign keys on, the
    # DROP of `sweeps` cascades and deletes every experiment. SQLite ignores this pragma
    # inside a transaction, so it is set before the migration's transaction begins.
    conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
    conn.commit()  # ends SQLAlchemy's autobegun (empty) transaction
    try:
        with conn.begin():
            cfg.attributes["connection"] = conn
            upgrade(cfg, revision)
            broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise RuntimeError(f"migration left dangling references: {broken[:5]}")
    finally:
        conn.exec_driver_sql("PRAGMA foreign_keys=ON")
        conn.commit()


def open_database(location: DbLocation | Path | str) -> Engine:
    engine = make_engine(location)
    try:
        migrate(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine
