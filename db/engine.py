"""Engine factory for SQLite: WAL, foreign keys, busy timeout; migrations on open.

Nothing is created at import time: callers (app factory, CLI) build an engine from a path.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event

from agent.private import private_file

logger = logging.getLogger(__name__)
BUSY_TIMEOUT_MS = 30_000


def _on_connect(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def make_engine(path: Path | str) -> Engine:
    """An engine for the SQLite file at `path` (parent folders are created 0700, the file and
    its -wal/-shm companions 0600)."""
    path = Path(path).expanduser()
    for companion in ("", "-wal", "-shm"):
        private_file(path.with_name(path.name + companion))
    engine = create_engine(
        f"sqlite:///{path}",
        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000},
        pool_size=8,
        max_overflow=16,
    )
    event.listen(engine, "connect", _on_connect)
    return engine


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (a no-op when already there)."""
    from alembic import command
    from alembic.config import Config

    # Alembic narrates every start at INFO ("setup plugin ..."); keep the service log readable.
    logging.getLogger("alembic").setLevel(logging.WARNING)

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    cfg.attributes["connection"] = None
    with engine.connect() as conn:
        # A batch migration re-creates a table (copy, DROP, rename); with foreign keys on, the
        # DROP of `sweeps` cascades and deletes every experiment. SQLite ignores this pragma
        # inside a transaction, so it is set before the migration's transaction begins.
        conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
        conn.commit()  # ends SQLAlchemy's autobegun (empty) transaction
        try:
            with conn.begin():
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
                broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise RuntimeError(f"migration left dangling references: {broken[:5]}")
        finally:
            conn.exec_driver_sql("PRAGMA foreign_keys=ON")
            conn.commit()


def open_database(path: Path | str) -> Engine:
    engine = make_engine(path)
    migrate(engine)
    return engine
