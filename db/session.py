"""StoreBase: the SqlStore's engine and its one transaction helper (one StoreError per failure)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from agent.errors import ConflictError, NotFoundError, StoreError


class StoreBase:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def session(self, action: str) -> Iterator[Session]:
        """One transaction: commit on success, roll back on error, one readable StoreError."""
        with self._sessions() as s:
            try:
                yield s
                s.commit()
            except (NotFoundError, ConflictError):
                s.rollback()
                raise
            except SQLAlchemyError as exc:
                s.rollback()
                raise StoreError(
                    f"database error while {action}: {exc.__class__.__name__}: "
                    f"{getattr(exc, 'orig', exc)}"
                ) from exc
            except BaseException:
                s.rollback()
                raise

    def ping(self) -> None:
        with self.session("checking the database") as s:
            s.execute(text("SELECT 1"))
