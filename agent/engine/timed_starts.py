"""A sweep's timed start (`start_at`): an APScheduler date job that resumes the paused sweep.

APScheduler does only what it is for here: the start time is kept on the sweep row, so it
survives restarts (every paused sweep with a `start_at` gets its job again when the service
starts), and the job resumes the sweep and wakes the slots, then returns at once (on a full
disk, once the write succeeds: `retry_write`, the engine's
DiskSpaceWatch.retry_while_disk_full).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from agent.core.domain import SweepStatus, utcnow
from agent.core.errors import ConflictError, NotFoundError
from agent.core.ports import Store

logger = logging.getLogger(__name__)
T = TypeVar("T")


def _call_once(fn: Callable[[], T], _what: str = "") -> T:
    return fn()


class TimedStarts:
    def __init__(self, store: Store, wake: Callable[[], None],
                 retry_write: Callable[[Callable[[], None], str], None] = _call_once) -> None:
        self.store, self.wake, self.retry_write = store, wake, retry_write
        self._job_scheduler: Any = None

    def start(self) -> None:
        """Start the job scheduler with a date job for every scheduled start on record."""
        from apscheduler.schedulers.background import BackgroundScheduler

        self._job_scheduler = BackgroundScheduler(job_defaults={
            "coalesce": True, "max_instances": 1, "misfire_grace_time": None})
        self._job_scheduler.start()
        for sweep in self.store.list_sweeps([SweepStatus.PAUSED]):
            if sweep.start_at is not None:
                self._add_job(sweep.name, sweep.start_at)

    @property
    def running(self) -> bool:
        """False once started and then stopped (or dead); True before start (nothing to run)."""
        return self._job_scheduler is None or bool(self._job_scheduler.running)

    def shutdown(self) -> None:
        if self._job_scheduler is not None and self._job_scheduler.running:
            self._job_scheduler.shutdown(wait=False)

    def schedule(self, sweep_name: str, when: datetime) -> None:
        """Start (resume) a paused sweep at `when`; kept on the sweep row across restarts."""
        if self._job_scheduler is None:
            raise ConflictError("the scheduler is not running; cannot schedule a start")
        self.store.set_start_at(sweep_name, when)
        self._add_job(sweep_name, when)

    def _add_job(self, sweep_name: str, when: datetime) -> None:
        self._job_scheduler.add_job(self._start_at_its_time, "date",
                                    run_date=max(when, utcnow()), args=[sweep_name],
                                    id=f"start:{sweep_name}", replace_existing=True)

    def _start_at_its_time(self, sweep_name: str) -> None:
        self.retry_write(lambda: self.start_now(sweep_name), f"the timed start of {sweep_name}")

    def scheduled(self) -> dict[str, datetime]:
        return {s.name: s.start_at for s in self.store.list_sweeps([SweepStatus.PAUSED])
                if s.start_at is not None}

    def start_now(self, sweep_name: str) -> None:
        try:
            sweep = self.store.get_sweep(sweep_name)
        except NotFoundError:
            return
        if sweep.status is SweepStatus.PAUSED:
            self.store.set_sweep_status(sweep_name, SweepStatus.RUNNING)
            logger.info("sweep %s started at its scheduled time", sweep_name)
            self.wake()
