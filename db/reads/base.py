"""ReadsBase: a read model's access to the store's engine and sessions."""

from __future__ import annotations

from contextlib import AbstractContextManager

from sqlalchemy.orm import Session

from db.store import SqlStore


class ReadsBase:
    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.engine = store.engine

    def session(self, action: str) -> AbstractContextManager[Session]:
        """The store's transaction helper (inside `store.reading()`, that block's session)."""
        return self.store.session(action)

    def reading(self) -> AbstractContextManager[None]:
        return self.store.reading()

