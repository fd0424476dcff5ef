"""StoreBase: the SqlStore's engine and its one transaction helper (one StoreError per failure),
and `reading()`: several reads in one session (one connection, one transaction)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from agent.core.errors import ConflictError, NotFoundError, StoreError, says_out_of_space
from agent.engine.interrupts import signals_deferred

SQLITE_FULL = 13  # "database or disk is full"
PG_DISK_FULL = "53100"  # SQLSTATE disk_full ("could not extend file ...: No space left")
# The session `reading()` opened in this thread (or task), with the store it belongs to.
_SHARED: ContextVar[tuple[StoreBase, Session] | None] = ContextVar("overnight_shared_session",
                                                                    default=None)


class StoreBase:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def reading(self) -> Iterator[None]:
        """The store's reads inside share one session: one connection from the pool (one
        pre-ping), one transaction (one snapshot), instead of one of each per read. For reads
        only: a write inside would commit with the block, and on SQLite a read transaction
        that turns into a write can fail where its own transaction would have waited."""
        shared = _SHARED.get()
        if shared is not None and shared[0] is self:
            yield
            return
        with self.session("reading") as s:
            token = _SHARED.set((self, s))
            try:
                yield
            finally:
                _SHARED.reset(token)

    @contextmanager
    def session(self, action: str) -> Iterator[Session]:
        """One transaction: commit on success, roll back on error, one readable StoreError.
        Inside `reading()`, that block's session (it commits or rolls back at its end)."""
        shared = _SHARED.get()
        if shared is not None and shared[0] is self:
            try:
                yield shared[1]
            except SQLAlchemyError as exc:
                raise _store_error(action, exc) from exc
            return
        # a Ctrl-C waits for the commit or rollback
        with signals_deferred(), self._sessions() as s:
            try:
                yield s
                s.commit()
            except (NotFoundError, ConflictError):
                s.rollback()
                raise
            except SQLAlchemyError as exc:
                s.rollback()
                raise _store_error(action, exc) from exc
            except BaseException:
                s.rollback()
                raise

    def ping(self) -> None:
        with self.session("checking the database") as s:
            s.execute(text("SELECT 1"))

    def check_writes(self) -> None:
        """A write that changes nothing (the schema's version row set to itself): StoreError,
        `out_of_space` when the database cannot write for lack of space. Both SQLite and
        PostgreSQL write the row again, so it needs the space a small real write needs."""
        with self.session("checking that the database can write") as s:
            s.execute(text("UPDATE alembic_version SET version_num = version_num"))


def _store_error(action: str, exc: SQLAlchemyError) -> StoreError:
    orig = getattr(exc, "orig", None) or exc
    full = (getattr(orig, "sqlite_errorcode", None) == SQLITE_FULL
            or getattr(orig, "sqlstate", None) == PG_DISK_FULL or says_out_of_space(str(orig)))
    return StoreError(f"database error while {action}: {exc.__class__.__name__}: {orig}",
                      out_of_space=full)
