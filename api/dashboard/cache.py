"""What a sweep page derives from the whole sweep, cached per store under the sweep's version.

The plot, counts, evidence and digest of a sweep read every experiment (the digest every diff):
~1 s at 10,000 experiments, while the table, kept stack and live panel read a page each. Those
derived parts depend on the sweep's finished work (queued and running rows are not drawn, and
the page reads their counts and times afresh): `Store.sweep_version` changes whenever an
experiment or run finishes, so a value cached under it (and the sweep's best, which the page
also shows) is the value the page would compute now.
Entries are keyed weakly by the store (a store that goes away takes its entries with it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

T = TypeVar("T")
PER_STORE = 16  # sweeps remembered per store


class SweepCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_store: WeakKeyDictionary[Any, dict[int, tuple[Hashable, Any]]] = (
            WeakKeyDictionary())

    def get(self, store: Any, sweep_id: int, version: Hashable, make: Callable[[], T]) -> T:
        """The value cached for the sweep at `version`, else `make()` (then cached)."""
        hit = self.peek(store, sweep_id, version)
        return hit if hit is not None else self.put(store, sweep_id, version, make())

    def peek(self, store: Any, sweep_id: int, version: Hashable) -> Any | None:
        """The value cached for the sweep at `version`, or None."""
        with self._lock:
            hit = self._by_store.setdefault(store, {}).get(sweep_id)
        return hit[1] if hit is not None and hit[0] == version else None

    def latest(self, store: Any, sweep_id: int) -> tuple[Hashable, Any] | None:
        """(version, value) last cached for the sweep, whatever its version."""
        with self._lock:
            return self._by_store.setdefault(store, {}).get(sweep_id)

    def put(self, store: Any, sweep_id: int, version: Hashable, value: T) -> T:
        with self._lock:
            entries = self._by_store.setdefault(store, {})
            entries.pop(sweep_id, None)
            entries[sweep_id] = (version, value)
            while len(entries) > PER_STORE:
                entries.pop(next(iter(entries)))
        return value
