"""Ctrl-C and SIGTERM in a foreground run, delivered between store transactions.

Python raises a signal's exception wherever the main thread happens to be: in the middle of a
database write that can interrupt a commit or a connection's return to the pool. A foreground
run installs handlers that call `deliver`; the store marks each transaction of the main thread
with `shielded()`, and a signal that arrives inside one is raised as soon as the outermost one
ends (the write then commits or rolls back whole). A second signal while one is waiting is
raised at once: the way out of a write that is stuck (e.g. on a locked database).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_depth = 0  # store transactions open on the main thread
_pending: BaseException | None = None  # a signal's exception waiting for them to end


@contextmanager
def shielded() -> Iterator[None]:
    """A store transaction: on the main thread, a delivered signal waits for its end."""
    global _depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _pending is not None:
            exc, _pending = _pending, None
            raise exc


def deliver(exc: BaseException) -> None:
    """From a signal handler (which runs on the main thread): raise `exc` now, or when the
    store transaction in progress ends; now if another signal is already waiting."""
    global _pending
    if _depth == 0 or _pending is not None:
        _pending = None
        raise exc
    _pending = exc
