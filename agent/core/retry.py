"""Try a call again with exponential backoff: the one retry loop of the notifications and the
trackers (agent.ops.notify, agent.ops.track).

`retry(call, tries=…)` calls `call()` until it returns, at most `tries` times; between tries it
waits `backoff_s`, doubled each time up to `max_backoff_s`. Only an error `retryable` accepts
is tried again; any other, or the last one, is raised as it came. `pause(seconds)` does the
waiting and may refuse it (False: a closing deadline leaves no time), which ends the tries.
Pure apart from the sleep. Hand-written rather than tenacity: 30 lines against a new
dependency, and a wait that a closing deadline refuses is one return value here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def sleep(seconds: float) -> bool:
    """The default pause: sleep, and say the retry may go ahead."""
    time.sleep(seconds)
    return True


def retry(call: Callable[[], T], *, tries: int, backoff_s: float, max_backoff_s: float,
          retryable: Callable[[Exception], bool],
          pause: Callable[[float], bool] = sleep,
          failed: Callable[[int, Exception], None] | None = None) -> T:
    """`call()`'s value, trying it up to `tries` times (see the module docstring); `failed`
    hears each failed attempt (its number from 1, the error) before the wait."""
    wait = backoff_s
    for attempt in range(1, max(1, tries) + 1):
        try:
            return call()
        except Exception as exc:
            if failed is not None:
                failed(attempt, exc)
            if not retryable(exc) or attempt >= tries or not pause(wait):
                raise
            wait = min(wait * 2, max_backoff_s)
    raise AssertionError("unreachable: the last attempt returns or raises")
