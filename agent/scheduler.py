"""The service's scheduler: one APScheduler job per execution slot, windows and limits per sweep.

Whether a sweep may start another run now is agent.gate's pure rule; `SlotScheduler` is the
adapter that wires APScheduler, the Store, the Loop and the proposers together. Exactly one
SlotScheduler may run per database (the caller holds the instance lock, see
agent.recovery.InstanceLock).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any

from agent.domain import Experiment, ExperimentStatus, Finish, Sweep, SweepStatus, utcnow
from agent.errors import ConflictError, NotFoundError
from agent.gate import GateKind, SweepFacts, gate
from agent.ports import Clock, Store
from agent.recovery import SHUTDOWN_REASON

logger = logging.getLogger(__name__)

# Statuses that use up one of a sweep's max_experiments (queued ones do not, nor do
# cancelled/interrupted runs, which are the service's doing, not the proposal's).
USED = (ExperimentStatus.RUNNING, ExperimentStatus.KEPT, ExperimentStatus.DISCARDED,
        ExperimentStatus.CRASHED, ExperimentStatus.TIMEOUT, ExperimentStatus.REJECTED)


class _SkippedRunFilter(logging.Filter):
    """A slot busy with a long run makes its interval job 'skip' every tick: that is the design
    (max_instances=1), not a warning worth a log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "maximum number of running instances reached" not in record.getMessage()


class SystemClock:
    def now(self) -> datetime:
        return utcnow()


def slot_env(slot: int, gpu_count: int) -> dict[str, str]:
    """Slot i is pinned to GPU i (modulo the GPUs present); nothing is set without GPUs."""
    return {"CUDA_VISIBLE_DEVICES": str(slot % gpu_count)} if gpu_count > 0 else {}


def gpu_count() -> int:
    """NVIDIA GPUs visible to the driver, without importing torch (0 when none)."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


# --- persistent scheduled starts ----------------------------------------------------------
# APScheduler stores a job as a textual reference to a module-level function plus its args, so
# the job finds the live scheduler through this registry (keyed by the database path).
_LIVE: dict[str, SlotScheduler] = {}


def scheduled_start(db_key: str, sweep_name: str) -> None:
    """Job body of a sweep's scheduled start: resume the sweep if it is still paused."""
    sched = _LIVE.get(db_key)
    if sched is None:
        logger.warning("scheduled start of %s: no live scheduler for %s", sweep_name, db_key)
        return
    sched.start_now(sweep_name)


@dataclass
class SchedulerSettings:
    db_path: Path
    slots: int = 1
    poll_interval_s: float = 1.0
    gpu_count: int = 0
    jobs_url: str | None = None  # SQLAlchemy URL of the job store (default: <db>.jobs.sqlite)
    grace_s: float = 5.0
    tz: tzinfo | None = None  # window times are in this zone (default: server local time)
    extra_env: dict[str, str] = field(default_factory=dict)
    device: str | None = None  # OVERNIGHT_DEVICE for every run (e.g. "cpu")


LoopFactory = Callable[[Sweep, int], Any]  # (sweep, slot) -> agent.loop.Loop


class SlotScheduler:
    """N slot jobs on a BackgroundScheduler; each runs one experiment at a time."""

    def __init__(self, store: Store, settings: SchedulerSettings, loop_factory: LoopFactory,
                 clock: Clock | None = None) -> None:
        self.store, self.settings, self.loop_factory = store, settings, loop_factory
        self.clock: Clock = clock or SystemClock()
        self._pick_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._loops: dict[tuple[int, int], Any] = {}
        self._running: dict[int, tuple[int, Any]] = {}  # exp id -> (slot, loop)
        self._proposing: set[int] = set()  # sweep ids whose proposer is being asked
        self._stopping = threading.Event()
        self._aps: Any = None
        self.db_key = str(Path(settings.db_path).expanduser().resolve())

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.jobstores.memory import MemoryJobStore
        from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
        from apscheduler.schedulers.background import BackgroundScheduler

        url = self.settings.jobs_url or f"sqlite:///{self.db_key}.jobs.sqlite"
        self._aps = BackgroundScheduler(
            jobstores={"default": MemoryJobStore(), "persistent": SQLAlchemyJobStore(url=url)},
            executors={"default": ThreadPoolExecutor(max(self.settings.slots, 1) + 2)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        aps_log = logging.getLogger("apscheduler.scheduler")
        if not any(isinstance(f, _SkippedRunFilter) for f in aps_log.filters):
            aps_log.addFilter(_SkippedRunFilter())
        _LIVE[self.db_key] = self
        for slot in range(self.settings.slots):
            self._aps.add_job(self.run_slot, "interval", args=[slot], id=f"slot-{slot}",
                              seconds=self.settings.poll_interval_s, next_run_time=utcnow(),
                              jobstore="default")
        self._aps.start()
        logger.info("scheduler started: %d slot(s), poll every %.2fs", self.settings.slots,
                    self.settings.poll_interval_s)

    @property
    def alive(self) -> bool:
        return bool(self._aps is not None and self._aps.running and not self._stopping.is_set())

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop taking work; runs in flight are stopped and recorded `interrupted`.

        They are re-queued by restart recovery (a clean shutdown is not the proposal's fault).
        """
        self._stopping.set()
        if self._pick_lock.acquire(timeout=timeout_s):  # let a claim in progress register
            self._pick_lock.release()
        with self._state_lock:
            running = dict(self._running)
        for exp_id, (_slot, loop) in running.items():
            try:
                self.store.finish(exp_id, Finish(ExperimentStatus.INTERRUPTED,
                                                 reason=SHUTDOWN_REASON))
            except (ConflictError, NotFoundError):
                continue  # it finished on its own meanwhile
            loop.cancel(exp_id)
        if self._aps is not None:
            self._aps.shutdown(wait=True)
        _LIVE.pop(self.db_key, None)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """No slot picks new work inside this block (e.g. create a sweep and pause it)."""
        with self._pick_lock:
            yield

    # --- scheduled starts -------------------------------------------------------------------
    def schedule_start(self, sweep_name: str, when: datetime) -> None:
        """Persist a one-off start (resume) of a paused sweep; survives restarts."""
        if self._aps is None:
            raise ConflictError("the scheduler is not running; cannot schedule a start")
        self._aps.add_job(scheduled_start, "date", run_date=when, args=[self.db_key, sweep_name],
                          id=f"start:{sweep_name}", jobstore="persistent", replace_existing=True)

    def scheduled_starts(self) -> dict[str, datetime]:
        if self._aps is None:
            return {}
        return {job.args[1]: job.next_run_time for job in self._aps.get_jobs("persistent")}

    def start_now(self, sweep_name: str) -> None:
        try:
            sweep = self.store.get_sweep(sweep_name)
        except NotFoundError:
            return
        if sweep.status is SweepStatus.PAUSED:
            self.store.set_sweep_status(sweep_name, SweepStatus.RUNNING)
            logger.info("sweep %s started at its scheduled time", sweep_name)

    # --- slots ------------------------------------------------------------------------------
    def busy(self) -> int:
        with self._state_lock:
            return len(self._running)

    def running_ids(self) -> list[int]:
        with self._state_lock:
            return sorted(self._running)

    def cancel(self, experiment_id: int) -> bool:
        """Stop a running experiment of this process (recorded `cancelled`); False if not here."""
        with self._state_lock:
            entry = self._running.get(experiment_id)
        return bool(entry and entry[1].cancel(experiment_id))

    def run_slot(self, slot: int) -> int:
        """One job tick: run experiments back to back until there is nothing to start."""
        done = 0
        while not self._stopping.is_set():
            picked = self.pick(slot)
            if picked is None:
                break
            sweep, exp, loop = picked
            self._execute(slot, sweep, exp, loop)
            done += 1
        return done

    def _execute(self, slot: int, sweep: Sweep, exp: Experiment, loop: Any) -> None:
        try:
            result = loop.execute(sweep, exp)
        except ConflictError as exc:  # interrupted by a shutdown or cancelled meanwhile
            logger.info("experiment %s ended elsewhere: %s", exp.id, exc)
            return
        except Exception:
            logger.exception("slot %d: experiment %s failed unexpectedly", slot, exp.id)
            return
        finally:
            with self._state_lock:
                self._running.pop(exp.id, None)
        if result.is_baseline and result.status is not ExperimentStatus.KEPT:
            logger.error("baseline of %s failed (%s); stopping the sweep", sweep.name,
                         result.reason)
            self.store.set_sweep_status(sweep.name, SweepStatus.STOPPED)

    def facts(self, sweep: Sweep) -> SweepFacts:
        count = self.store.count_experiments
        return SweepFacts(
            status=sweep.status, max_experiments=sweep.max_experiments, deadline=sweep.deadline,
            window=sweep.window, used=count(sweep.id, USED, is_baseline=False),
            running=count(sweep.id, [ExperimentStatus.RUNNING]),
            baseline_kept=sweep.baseline_metric is not None,
        )

    def pick(self, slot: int) -> tuple[Sweep, Experiment, Any] | None:
        """Claim the next experiment for `slot`: queued first (priority, FIFO), then proposed.

        Asking a proposer (a language model may take many seconds) happens outside the pick
        lock, one proposer call per sweep at a time, so other slots and `holding()` callers
        never wait on it.
        """
        tried: set[int] = set()
        while True:
            with self._pick_lock:
                if self._stopping.is_set():
                    return None
                open_sweeps = self._open_sweeps()
                for sweep in open_sweeps:  # queued work of any open sweep before proposing
                    exp = self._claim_queued(sweep)
                    if exp is not None:
                        return self._claimed(slot, sweep, exp)
                chosen = self._choose_proposer([s for s in open_sweeps if s.id not in tried],
                                               slot)
                if chosen is None:
                    return None
            sweep, loop = chosen
            tried.add(sweep.id)
            picked = self._propose(slot, sweep, loop)
            if picked is not None:
                return picked

    def _propose(self, slot: int, sweep: Sweep, loop: Any) -> tuple[Sweep, Experiment, Any] | None:
        try:
            exp = loop.next_experiment(sweep)
        finally:
            with self._state_lock:
                self._proposing.discard(sweep.id)
        with self._pick_lock:
            if exp is None:
                if not self.store.count_experiments(
                        sweep.id, [ExperimentStatus.RUNNING, ExperimentStatus.QUEUED]):
                    self._finish_sweep(sweep, loop.limit_reached(sweep) or "no more proposals")
                return None
            if self._stopping.is_set():  # shut down while proposing: hand it to recovery
                self.store.finish(exp.id, Finish(ExperimentStatus.INTERRUPTED,
                                                 reason=SHUTDOWN_REASON))
                return None
            return self._claimed(slot, sweep, exp)

    def _open_sweeps(self) -> list[Sweep]:
        now = self.clock.now()
        open_sweeps = []
        for sweep in self.store.list_sweeps():
            if sweep.status is not SweepStatus.RUNNING:
                continue
            verdict = gate(self.facts(sweep), now, self.settings.tz)
            if verdict.kind is GateKind.FINISH:
                self._finish_sweep(sweep, verdict.reason)
            elif verdict.kind is GateKind.START:
                open_sweeps.append(sweep)
        return open_sweeps

    def _choose_proposer(self, open_sweeps: list[Sweep], slot: int) -> tuple[Sweep, Any] | None:
        """The first open sweep with a proposer that nobody is asking right now (marked busy)."""
        for sweep in open_sweeps:
            if sweep.baseline_metric is None:
                continue  # nothing is proposed before the baseline is in
            with self._state_lock:
                if sweep.id in self._proposing:
                    continue
            loop = self._loop(sweep, slot)
            if loop.proposer is None:
                continue  # a queue-only sweep waits for POST /experiments
            with self._state_lock:
                self._proposing.add(sweep.id)
            return sweep, loop
        return None

    def _claim_queued(self, sweep: Sweep) -> Experiment | None:
        """Priority then FIFO; but until the baseline is kept, only the baseline may run."""
        if sweep.baseline_metric is not None:
            return self.store.claim_next(sweep.id)
        queued = self.store.list_experiments(sweep.id, [ExperimentStatus.QUEUED])
        base = next((e for e in queued if e.is_baseline), None)
        if base is None:  # gate() let us in, so nothing of the sweep runs: the baseline is lost
            logger.error("sweep %s has no baseline to run (cancelled or given up); stopping it",
                         sweep.name)
            self.store.set_sweep_status(sweep.name, SweepStatus.STOPPED)
            return None
        return self.store.claim(base.id)

    def _claimed(self, slot: int, sweep: Sweep, exp: Experiment) -> tuple[Sweep, Experiment, Any]:
        loop = self._loop(sweep, slot)
        with self._state_lock:
            self._running[exp.id] = (slot, loop)
        logger.info("slot %d: experiment %s of %s", slot, exp.id, sweep.name)
        return sweep, exp, loop

    def _finish_sweep(self, sweep: Sweep, reason: str) -> None:
        if self.store.count_experiments(sweep.id, [ExperimentStatus.RUNNING]):
            return  # the in-flight run finishes first (it may still be kept)
        logger.info("sweep %s done: %s", sweep.name, reason)
        self.store.set_sweep_status(sweep.name, SweepStatus.DONE)

    def _loop(self, sweep: Sweep, slot: int) -> Any:
        key = (sweep.id, slot)
        with self._state_lock:
            loop = self._loops.get(key)
        if loop is None:
            loop = self.loop_factory(sweep, slot)
            with self._state_lock:
                self._loops[key] = loop
        return loop
