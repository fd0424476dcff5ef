"""Running state for folds: lists in a dict that a copy replaces before it first adds to them
(copy on write), so a copy costs the dict and folding n rows costs n appends; and a sorted
list that takes values in any order without an insertion per value."""

from __future__ import annotations

import bisect
from collections.abc import Hashable
from typing import Any, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


def appended(lists: dict[K, list[T]], owned: set[object], tag: str, key: K, value: T
             ) -> list[T]:
    """`lists[key]` with `value` appended: in place when this holder made that list (its
    (tag, key) is in `owned`), else as a new list (the old one may be shared with a copy)."""
    mine = (tag, key)
    found = lists.get(key)
    if found is not None and mine in owned:
        found.append(value)
        return found
    made = lists[key] = [*(found or ()), value]
    owned.add(mine)
    return made


class Ordered:
    """A sorted list that takes values in any order: a few new ones are inserted by bisection
    when it is read, many (a fold of a whole sweep) sorted in at once. Values must compare
    without ties reaching objects that cannot be ordered."""

    def __init__(self, values: list[Any] | None = None, new: list[Any] | None = None) -> None:
        self._sorted = values if values is not None else []
        self._new = new if new is not None else []

    def add(self, value: Any) -> None:
        self._new.append(value)

    def __len__(self) -> int:
        return len(self._sorted) + len(self._new)

    def values(self) -> list[Any]:
        """The values, sorted (do not change the list)."""
        if len(self._new) > 64:
            self._sorted = sorted([*self._sorted, *self._new])
        else:
            for v in self._new:
                bisect.insort(self._sorted, v)
        self._new = []
        return self._sorted

    def copy(self) -> Ordered:
        return Ordered(list(self.values()))
