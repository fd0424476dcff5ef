"""Ctrl-C and SIGTERM in a foreground run, raised between store transactions.

Python raises a signal's exception wherever the main thread happens to be: in the middle of a
database write that can interrupt a commit or a connection's return to the pool. A foreground
run installs handlers that call `raise_when_safe`; the store wraps each transaction of the main
thread in `signals_deferred()`, and a signal that arrives inside one is raised as soon as the
outermost one ends (the write then commits or rolls back whole). A second signal while one is
waiting is raised at once: the way out of a write that is stuck (e.g. on a locked database).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_open_transactions = 0  # store transactions open on the main thread
_deferred_signal: BaseException | None = None  # a signal's exception waiting for them to end


@contextmanager
def signals_deferred() -> Iterator[None]:
    """A store transaction: on the main thread, a signal (raise_when_safe) waits for its end."""
    global _open_transactions, _deferred_signal
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _open_transactions += 1
    try:
        yield
    finally:
        _open_transactions -= 1
        if _open_transactions == 0 and _deferred_signal is not None:
            exc, _deferred_signal = _deferred_signal, None
            raise exc


def raise_when_safe(exc: BaseException) -> None:
    """From a signal handler (which runs on the main thread): raise `exc` now when no store
    transaction is open, else when the one in progress ends; now if another signal is already
    waiting."""
    global _deferred_signal
    if _open_transactions == 0 or _deferred_signal is not None:
        _deferred_signal = None
        raise exc
    _deferred_signal = exc
