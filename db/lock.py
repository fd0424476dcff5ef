"""The instance lock on PostgreSQL: a session advisory lock on a connection of its own.

One executing process per database (the engine's recovery treats every `running` row as left
by a dead process, so two engines on one database would interrupt each other's runs). A SQLite
file is guarded by a flock on `<db>.lock` (agent.recovery.InstanceLock); a server database has
no file beside it, and the services sharing it may run on different machines, so the lock is
the server's: `pg_try_advisory_lock` on a dedicated connection held for the process's life.
A new process waits a few seconds for a holder that is going away (a restart right after a
kill). The server drops it when that session ends: the process exits, is killed (-9 included: the
kernel closes the socket), or its machine vanishes (TCP keepalives end the session in about a
minute).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from agent.recovery import DatabaseLock, InstanceLock, InstanceLockError
from db.engine import LOCK_CLASS, postgres_connect_args
from db.location import DbLocation

INSTANCE_LOCK = 1  # the key beside LOCK_CLASS (db.engine.MIGRATION_LOCK is 2)
KEYS = {"c": LOCK_CLASS, "k": INSTANCE_LOCK}
LOCK_WAIT_S = 5.0
LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE of a lock wait that ran past lock_timeout
# The server probes an idle lock session every 20 s and ends it after 3 unanswered probes.
KEEPALIVE_OPTIONS = ("-c tcp_keepalives_idle=20 -c tcp_keepalives_interval=10 "
                     "-c tcp_keepalives_count=3")

_HOLDER = text(
    "SELECT a.application_name, a.client_addr, a.pid FROM pg_locks l "
    "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
    "AND l.classid = :c AND l.objid = :k AND l.objsubid = 2 AND l.database = "
    "(SELECT oid FROM pg_database WHERE datname = current_database())")


class AdvisoryLock:
    """`pg_advisory_lock(LOCK_CLASS, INSTANCE_LOCK)` held by one dedicated session."""

    def __init__(self, location: DbLocation, wait_s: float = LOCK_WAIT_S) -> None:
        self.location, self.wait_s = location, wait_s
        self._conn: Connection | None = None

    def acquire(self) -> AdvisoryLock:
        """Take the lock, waiting up to `wait_s` for a holder that is going away, or raise
        InstanceLockError naming the holder."""
        name = f"overnight pid {os.getpid()} on {socket.gethostname()}"[:63]
        args: dict[str, Any] = postgres_connect_args(name)
        args["options"] += " " + KEEPALIVE_OPTIONS
        engine = create_engine(self.location.url, poolclass=NullPool, connect_args=args)
        try:
            conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        except SQLAlchemyError as exc:
            engine.dispose()
            raise InstanceLockError(f"cannot reach {self.location} to take the instance lock: "
                                    f"{getattr(exc, 'orig', exc)}") from None
        if self._take(conn):
            self._conn = conn
            return self
        holder = conn.execute(_HOLDER, KEYS).first()
        conn.close()
        engine.dispose()
        who = (f"{holder.application_name or 'unnamed'}, server pid {holder.pid}, "
               f"from {holder.client_addr or 'a local socket'}") if holder else "unknown"
        raise InstanceLockError(
            f"another overnight process (serve, run or mcp --run; {who}) is already using this "
            f"database (advisory lock on {self.location}); queue work through it, stop it "
            "first, or use another --db")

    def _take(self, conn: Connection) -> bool:
        if self.wait_s <= 0:
            return bool(conn.execute(text("SELECT pg_try_advisory_lock(:c, :k)"), KEYS).scalar())
        # A holder that was just killed keeps the lock until the server sees its socket close
        # (a moment); a restart right after a crash waits for that instead of failing.
        conn.execute(text(f"SET lock_timeout = '{int(self.wait_s * 1000)}ms'"))
        try:
            conn.execute(text("SELECT pg_advisory_lock(:c, :k)"), KEYS)
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
            return False
        finally:
            conn.execute(text("SET lock_timeout = 0"))
        return True

    @property
    def held(self) -> bool:
        return self._conn is not None

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.execute(text("SELECT pg_advisory_unlock(:c, :k)"), KEYS)
        except SQLAlchemyError:
            pass  # the session is gone, and the lock with it
        finally:
            conn.close()
            conn.engine.dispose()


def instance_lock(location: DbLocation) -> DatabaseLock:
    """Take the database's instance lock: a flock beside a SQLite file, an advisory lock on
    PostgreSQL. InstanceLockError if another process holds it."""
    if location.path is not None:
        return InstanceLock(location.path).acquire()
    return AdvisoryLock(location).acquire()
