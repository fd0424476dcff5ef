"""The instance lock on PostgreSQL: a session advisory lock on a connection of its own.

One executing process per database (the engine's recovery treats every `running` row as left by a
dead process, so two engines on one database would interrupt each other's runs). A SQLite file is
guarded by a flock on `<db>.lock` (agent.engine.recovery.InstanceLock); a server database has no
file beside it, and the services sharing it may run on different machines, so the lock is the
server's: `pg_try_advisory_lock` on a dedicated connection held for the process's life. A new
process waits a few seconds for a holder that is going away (a restart right after a kill); a holder
whose session is cut (the server restarted) takes the lock again on a new one. The server drops it
when that session ends: the process exits, is killed (-9 included: the kernel closes the socket), or
its machine vanishes (TCP keepalives end the session in about a minute).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from agent.engine.recovery import DatabaseLock, InstanceLock, InstanceLockError
from db.engine import CONNECT_TIMEOUT_S, LOCK_CLASS, postgres_connect_args
from db.location import DbLocation

logger = logging.getLogger(__name__)
INSTANCE_LOCK = 1  # the key beside LOCK_CLASS (db.engine.MIGRATION_LOCK is 2)
KEYS = {"c": LOCK_CLASS, "k": INSTANCE_LOCK}
LOCK_WAIT_S = 5.0
CHECK_S = 10.0  # how often the lock's session is checked (and, if cut, the lock re-taken)
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
    """`pg_advisory_lock(LOCK_CLASS, INSTANCE_LOCK)` held by one dedicated session, watched:
    if that session is cut (a server restart), the lock is taken again on a new one."""

    def __init__(self, location: DbLocation, wait_s: float = LOCK_WAIT_S,
                 check_s: float = CHECK_S) -> None:
        self.location, self.wait_s, self.check_s = location, wait_s, check_s
        self._conn: Connection | None = None
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None

    def acquire(self) -> AdvisoryLock:
        """Take the lock, waiting up to `wait_s` for a holder that is going away, or raise
        InstanceLockError naming the holder."""
        try:
            conn = self._connect()
        except SQLAlchemyError as exc:
            raise InstanceLockError(f"cannot reach {self.location} to take the instance lock: "
                                    f"{getattr(exc, 'orig', exc)}") from None
        try:
            taken = self._take(conn, self.wait_s)
        except SQLAlchemyError as exc:
            _close(conn)
            raise InstanceLockError(f"cannot take the instance lock on {self.location}: "
                                    f"{getattr(exc, 'orig', exc)}") from None
        if taken:
            self._conn = conn
            self._watch = threading.Thread(target=self._watch_session, daemon=True,
                                           name="overnight-instance-lock")
            self._watch.start()
            return self
        holder = _holder(conn)
        _close(conn)
        raise InstanceLockError(
            f"another overnight process (serve, run or mcp --run; {holder}) is already using "
            f"this database (advisory lock on {self.location}); queue work through it, stop "
            "it first, or use another --db")

    def _connect(self) -> Connection:
        name = f"overnight pid {os.getpid()} on {socket.gethostname()}"[:63]
        args: dict[str, Any] = postgres_connect_args(name)
        args["options"] += " " + KEEPALIVE_OPTIONS
        engine = create_engine(self.location.url, poolclass=NullPool, connect_args=args)
        try:
            return engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        except BaseException:
            engine.dispose()
            raise

    @staticmethod
    def _take(conn: Connection, wait_s: float) -> bool:
        if wait_s <= 0:
            return bool(conn.execute(text("SELECT pg_try_advisory_lock(:c, :k)"), KEYS).scalar())
        # A holder that was just killed keeps the lock until the server sees its socket close
        # (a moment); a restart right after a crash waits for that instead of failing.
        conn.execute(text(f"SET lock_timeout = '{int(wait_s * 1000)}ms'"))
        try:
            conn.execute(text("SELECT pg_advisory_lock(:c, :k)"), KEYS)
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                raise
            return False
        finally:
            conn.execute(text("SET lock_timeout = 0"))
        return True

    def _watch_session(self) -> None:
        """Every `check_s`: is the lock's session alive? If not, take the lock again."""
        warned = False
        while not self._stop.wait(self.check_s):
            with self._mutex:
                if self._stop.is_set():
                    return
                if self._conn is not None and _alive(self._conn):
                    continue
                if self._conn is not None:
                    logger.error("the instance lock's session on %s ended; taking the lock "
                                 "again", self.location)
                    _close(self._conn)
                    self._conn = None
                warned = self._retake(warned)

    def _retake(self, warned: bool) -> bool:
        try:
            conn = self._connect()
        except SQLAlchemyError:
            return warned  # the server is still away: try again next time
        if self._take(conn, 0):
            self._conn = conn
            logger.warning("instance lock on %s taken again", self.location)
            return False
        if not warned:
            logger.critical("another process took the instance lock on %s (%s) while this "
                            "one lost its session: stop one of them", self.location,
                            _holder(conn))
        _close(conn)
        return True

    @property
    def held(self) -> bool:
        return self._conn is not None

    def release(self) -> None:
        self._stop.set()
        with self._mutex:
            conn, self._conn = self._conn, None
        if self._watch is not None and self._watch is not threading.current_thread():
            self._watch.join(timeout=self.check_s + CONNECT_TIMEOUT_S + 5)
        if conn is None:
            return
        try:
            conn.execute(text("SELECT pg_advisory_unlock(:c, :k)"), KEYS)
        except SQLAlchemyError:
            pass  # the session is gone, and the lock with it
        finally:
            _close(conn)


def _alive(conn: Connection) -> bool:
    try:
        conn.execute(text("SELECT 1"))
        return True
    except SQLAlchemyError:
        return False


def _close(conn: Connection) -> None:
    try:
        conn.close()
    except SQLAlchemyError:
        pass  # already broken
    conn.engine.dispose()


def _holder(conn: Connection) -> str:
    try:
        row = conn.execute(_HOLDER, KEYS).first()
    except SQLAlchemyError:
        row = None
    if row is None:
        return "unknown"
    return (f"{row.application_name or 'unnamed'}, server pid {row.pid}, "
            f"from {row.client_addr or 'a local socket'}")


def instance_lock(location: DbLocation) -> DatabaseLock:
    """Take the database's instance lock: a flock beside a SQLite file, an advisory lock on
    PostgreSQL. InstanceLockError if another process holds it."""
    if location.path is not None:
        return InstanceLock(location.path).acquire()
    return AdvisoryLock(location).acquire()
