"""Where POST /experiments does its blocking work: worker threads of its own, bounded per sweep.

Admission (the database's duplicate check, git applying the diff, the insert) blocks, so it runs
in a worker thread, never on the event loop. Its threads are counted by a limiter of their own,
not the one plain `def` routes share: a hundred agents queueing at once cannot take the threads
that `GET /health` or a dashboard page need. Each sweep also has its own limit, so one sweep's
flood (or a slow repository) waits behind itself and never in front of another sweep.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import anyio

T = TypeVar("T")
ADMISSIONS_PER_SWEEP = 4  # worker threads one sweep's admissions may hold at once
ADMISSIONS_TOTAL = 24  # worker threads all admissions may hold at once


class AdmissionGate:
    """Runs blocking admission work in worker threads: at most `per_sweep` of one sweep's and
    `total` of all at once. Used on the event loop only (its dict needs no lock)."""

    def __init__(self, per_sweep: int = ADMISSIONS_PER_SWEEP,
                 total: int = ADMISSIONS_TOTAL) -> None:
        self.per_sweep = per_sweep
        self.total = total
        self._threads: anyio.CapacityLimiter | None = None
        self._sweeps: dict[str, anyio.CapacityLimiter] = {}

    async def run(self, sweep: str, work: Callable[[], T]) -> T:
        """`work()` in a worker thread once `sweep` has a free place; its result."""
        async with self._place(sweep):
            if self._threads is None:  # created on the event loop that uses it
                self._threads = anyio.CapacityLimiter(self.total)
            return await anyio.to_thread.run_sync(work, limiter=self._threads)

    @asynccontextmanager
    async def _place(self, sweep: str) -> AsyncIterator[None]:
        limiter = self._sweeps.get(sweep)
        if limiter is None:
            limiter = self._sweeps[sweep] = anyio.CapacityLimiter(self.per_sweep)
        try:
            async with limiter:
                yield
        finally:
            # Forget an idle sweep's limiter: names sent by clients never pile up here.
            stats = limiter.statistics()
            if not stats.borrowed_tokens and not stats.tasks_waiting:
                self._sweeps.pop(sweep, None)
