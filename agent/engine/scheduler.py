"""The engine: N execution slots over the store's queue, for the service and the foreground alike.

Whether a sweep may start another run now is agent.rules.gate's pure rule; `SlotScheduler` applies
it for every driver. `start()` runs the slots as worker threads for the life of a service (`serve`,
`mcp --run`); `run_burst()` runs the same slots until nothing is left to start (rq's burst mode) —
that is what a foreground `overnight run` is. APScheduler only does what it is for: a sweep's timed
start (`start_at`, kept on the sweep row so it survives restarts) is a date job
(agent.engine.timed_starts) that resumes the sweep and returns at once. Exactly one SlotScheduler
may run per database (the caller holds the instance lock, see agent.engine.recovery.InstanceLock).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Any

from agent.core.domain import (
    Experiment,
    ExperimentStatus,
    Sweep,
    SweepStatus,
    utcnow,
)
from agent.core.errors import ConflictError, NotFoundError, StoreError
from agent.core.ports import Clock, Store
from agent.core.record import Ending
from agent.engine.claims import (
    claim_continuation,
    claim_queued,
    continuations,
    finish_sweep,
    sweep_facts,
)
from agent.engine.devices import DeviceWatch
from agent.engine.recovery import SHUTDOWN_REASON
from agent.engine.timed_starts import TimedStarts
from agent.engine.writes import DiskSpaceWatch
from agent.rules.classify import is_device_failure
from agent.rules.endings import finish_of, interrupted
from agent.rules.gate import Gate, GateKind, SweepFacts, gate

logger = logging.getLogger(__name__)


class SystemClock:
    def now(self) -> datetime:
        return utcnow()


@dataclass
class SchedulerSettings:
    slots: int = 1
    poll_interval_s: float = 1.0  # how often an idle slot looks for work
    devices: tuple[str, ...] = ()  # GPU indexes; slot i gets devices[i % n] (none: CPU)
    grace_s: float = 5.0
    tz: tzinfo | None = None  # window times are in this zone (default: server local time)
    extra_env: dict[str, str] = field(default_factory=dict)
    device: str | None = None  # OVERNIGHT_DEVICE for every run (e.g. "cpu")
    executor: str = "local"  # "local": this machine; "ray": Ray tasks; "slurm": Slurm jobs
    ray_address: str | None = None  # the cluster to join (None: this machine's, "auto")
    ray_gpus: float = 1.0  # what one run asks of the cluster
    ray_cpus: float = 1.0
    ray_resources: dict[str, float] = field(default_factory=dict)  # custom resources per run
    slurm_partition: str | None = None  # None: the cluster's default partition
    slurm_account: str | None = None
    slurm_qos: str | None = None
    slurm_gpus: int = 1  # --gres=gpu:N per run (0: none)
    slurm_gres: str | None = None  # the site's own --gres instead, e.g. "gpu:a100:1"
    slurm_options: tuple[str, ...] = ()  # extra #SBATCH lines, e.g. "--mem=64G"


LoopFactory = Callable[[Sweep, int], Any]  # (sweep, slot) -> agent.engine.loop.Loop


@dataclass
class _Claim:
    """An experiment this process claimed: its slot, its loop and the event that stops it.

    The stop event exists from the claim on, so a cancel between the claim and the run is
    honoured rather than refused (a cancel that lands between the store's claim and this
    registration is kept in `_cancel_requests` and applied here).
    """

    slot: int
    loop: Any
    stop: threading.Event = field(default_factory=threading.Event)


class SlotScheduler:
    """N slots; each runs one experiment at a time, taking queued work first, then proposals."""

    def __init__(self, store: Store, settings: SchedulerSettings, loop_factory: LoopFactory,
                 clock: Clock | None = None, disk_space: DiskSpaceWatch | None = None) -> None:
        self.store, self.settings, self.loop_factory = store, settings, loop_factory
        self.clock: Clock = clock or SystemClock()
        # Whether writes fail for lack of space (shared with the loops): while they do, no
        # slot starts anything, and none of it pauses a sweep (agent.engine.writes).
        self.disk_space = disk_space or DiskSpaceWatch()
        self._pick_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._loops: dict[tuple[int, int], Any] = {}
        self._running: dict[int, _Claim] = {}  # exp id -> its claim
        self._cancel_requests: set[int] = set()  # claimed ids cancelled before registration
        self._proposing: set[int] = set()  # sweep ids whose proposer is being asked
        self._only_sweeps: frozenset[str] | None = None  # burst mode: only these sweeps
        self._stopping = threading.Event()
        self._wake = threading.Condition()
        self._threads: list[threading.Thread] = []
        self.timed_starts = TimedStarts(store, self.wake,
                                        retry_write=self.disk_space.retry_while_disk_full)
        self.devices = DeviceWatch(settings.devices)
        self.retired = self.devices.retired  # slot -> why it was taken out

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Service mode: slot worker threads, and a date job for every scheduled start."""
        self.timed_starts.start()
        for slot in range(self.settings.slots):
            t = threading.Thread(target=self._serve_slot, args=(slot,), daemon=True,
                                 name=f"overnight-slot-{slot}")
            t.start()
            self._threads.append(t)
        logger.info("scheduler started: %d slot(s)", self.settings.slots)

    def start_when_writable(self, prepare: Callable[[], object]) -> None:
        """start(), once `prepare()` (restart recovery: it must write) has succeeded: tried
        again each time writes succeed after failing for lack of space, in a thread of its own
        (the API answers meanwhile)."""

        def wait() -> None:
            while not self._stopping.is_set():
                self.disk_space.wait_writable(self._stopping, self.settings.poll_interval_s)
                if self._stopping.is_set():
                    return
                try:
                    prepare()
                except Exception as exc:
                    if self.disk_space.note_failure(exc, "restart recovery"):
                        continue
                    logger.exception("restart recovery failed; the engine does not start")
                    return
                self.start()
                return

        threading.Thread(target=wait, daemon=True, name="overnight-engine-start").start()

    def run_burst(self, only: Collection[str] | None = None) -> None:
        """Foreground mode: run the slots until nothing is left to start, then return.

        Slot 0 runs in the calling thread (so Ctrl-C lands in its run); others in threads.
        `only`: the names of the sweeps to run (default: every open sweep).
        """
        self._only_sweeps = frozenset(only) if only else None
        workers = [threading.Thread(target=self._burst_slot, args=(slot,), daemon=True,
                                    name=f"overnight-slot-{slot}")
                   for slot in range(1, max(self.settings.slots, 1))]
        for t in workers:
            t.start()
        try:
            self._burst_slot(0)
            for t in workers:
                while t.is_alive():
                    t.join(0.2)
        except BaseException:
            self.shutdown()
            raise

    @property
    def alive(self) -> bool:
        """Running, with every slot that was not taken out (retired) still working."""
        working = [t for slot, t in enumerate(self._threads) if slot not in self.retired]
        return (not self._stopping.is_set() and all(t.is_alive() for t in working)
                and self.timed_starts.running)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop taking work; runs in flight are stopped and recorded `interrupted`.

        They are re-queued by restart recovery (a clean shutdown is not the proposal's fault).
        """
        self._stopping.set()
        self.disk_space.stop()  # a write retried through a full disk gives up: recovery takes over
        self.wake()
        if self._pick_lock.acquire(timeout=timeout_s):  # let a claim in progress register
            self._pick_lock.release()
        with self._state_lock:
            running = dict(self._running)
        for exp_id, claim in running.items():
            try:
                self.store.finish(exp_id, finish_of(interrupted(SHUTDOWN_REASON,
                                                                on_purpose=True)))
            except (ConflictError, NotFoundError):
                continue  # it finished on its own meanwhile
            except StoreError as exc:  # e.g. no space: the next start's recovery records it
                logger.error("experiment %s: could not record its interruption (%s); the next "
                             "start re-queues it", exp_id, exc)
            claim.stop.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout_s)
        self.timed_starts.shutdown()

    def wake(self) -> None:
        """Tell idle slots to look for work now (new work queued, a sweep resumed)."""
        with self._wake:
            self._wake.notify_all()

    @contextlib.contextmanager
    def claims_paused(self) -> Iterator[None]:
        """No slot picks new work inside this block (e.g. create a sweep and pause it)."""
        with self._pick_lock:
            yield

    def _serve_slot(self, slot: int) -> None:
        while not self._stopping.is_set() and slot not in self.retired:
            self.disk_space.wait_writable(self._stopping, self.settings.poll_interval_s)
            try:
                if self.run_slot(slot):
                    continue
            except Exception as exc:  # a slot must outlive any one bad pick
                if not self.disk_space.note_failure(exc, f"slot {slot}"):
                    logger.exception("slot %d: picking work failed", slot)
            with self._wake:
                self._wake.wait(self.settings.poll_interval_s)

    def _burst_slot(self, slot: int) -> None:
        while not self._stopping.is_set() and slot not in self.retired:
            self.disk_space.wait_writable(self._stopping, self.settings.poll_interval_s)
            try:
                if self.run_slot(slot):
                    continue
            except Exception as exc:
                if not self.disk_space.note_failure(exc, f"slot {slot}"):
                    raise
            if self.disk_space.failing is not None:
                continue  # it stopped for the disk, not for want of work
            with self._state_lock:
                idle = not self._running and not self._proposing
            if idle:
                return
            with self._wake:  # another slot is running or proposing: it may leave work
                self._wake.wait(self.settings.poll_interval_s)

    # --- scheduled starts (agent.engine.timed_starts) -------------------------------------
    def schedule_start(self, sweep_name: str, when: datetime) -> None:
        self.timed_starts.schedule(sweep_name, when)

    def scheduled_starts(self) -> dict[str, datetime]:
        return self.timed_starts.scheduled()

    def start_now(self, sweep_name: str) -> None:
        self.timed_starts.start_now(sweep_name)

    # --- slots ------------------------------------------------------------------------------
    def busy(self) -> int:
        with self._state_lock:
            return len(self._running)

    def running_ids(self) -> list[int]:
        with self._state_lock:
            return sorted(self._running)

    def cancel(self, experiment_id: int) -> bool:
        """Stop an experiment this process claimed (recorded `cancelled`): running, or claimed
        but not started yet (even before its slot registered it). False if not ours to stop.

        One process executes a database's experiments (the instance lock), so a row `running`
        while this scheduler is alive is ours even before its slot has registered it.
        """
        with self._state_lock:
            claim = self._running.get(experiment_id)
            if claim is not None:
                claim.stop.set()
                return True
            if not self.alive:
                return False
            self._cancel_requests.add(experiment_id)  # honoured by _register_claim
        try:
            ours = self.store.get_experiment(experiment_id).status is ExperimentStatus.RUNNING
        except NotFoundError:
            ours = False
        if not ours:
            with self._state_lock:
                self._cancel_requests.discard(experiment_id)
        return ours

    def run_slot(self, slot: int) -> int:
        """Run experiments back to back until there is nothing to start; how many ran."""
        done = 0
        while not self._stopping.is_set() and slot not in self.retired:
            if self.disk_space.failing is not None:
                break  # the slot's loop waits until writes succeed again
            picked = self.pick(slot)
            if picked is None:
                break
            sweep, exp, loop = picked
            self._execute(slot, sweep, exp, loop)
            done += 1
        return done

    def _execute(self, slot: int, sweep: Sweep, exp: Experiment, loop: Any) -> None:
        with self._state_lock:
            claim = self._running.get(exp.id)
        stop = claim.stop if claim is not None else threading.Event()
        try:
            result = loop.execute(sweep, exp, stop=stop)
        except ConflictError as exc:  # interrupted by a shutdown or cancelled meanwhile
            logger.info("experiment %s ended elsewhere: %s", exp.id, exc)
            return
        except Exception as exc:  # the loop recorded the row; do not burn the queue on it
            if not self.disk_space.note_failure(exc, f"experiment {exp.id}"):
                logger.exception("slot %d: experiment %s failed unexpectedly", slot, exp.id)
            self._pause_sweep(sweep, f"experiment {exp.id} failed unexpectedly: {exc}", exc)
            return
        finally:
            with self._state_lock:
                self._running.pop(exp.id, None)
                self._cancel_requests.discard(exp.id)
            self.wake()  # a finished run may open the gate for others (the baseline)
        record = result.record
        if record is not None and record.ending is Ending.NOT_STARTED:
            # the executor could not start it (a refused job, no node or GPU for it): the next
            # run would meet the same refusal, so the sweep waits for the fix; it is queued again
            self._pause_sweep(sweep, f"experiment {exp.id} was not started: {result.reason}")
            return
        crashed = result.status in (ExperimentStatus.CRASHED, ExperimentStatus.TIMEOUT)
        self.devices.record_run(
            slot, crashed and is_device_failure(result.reason, result.log_tail), result.reason)
        # An interrupted baseline (its worker was lost) is queued again: the sweep goes on.
        if result.is_baseline and result.status not in (ExperimentStatus.KEPT,
                                                        ExperimentStatus.INTERRUPTED):
            logger.error("baseline of %s failed (%s); stopping the sweep", sweep.name,
                         result.reason)
            self.store.set_sweep_status(sweep.name, SweepStatus.STOPPED)

    def facts(self, sweep: Sweep) -> SweepFacts:
        return sweep_facts(self.store, sweep)

    def _gate(self, sweep: Sweep) -> Gate:
        return gate(self.facts(sweep), self.clock.now(), self.settings.tz)

    def pick(self, slot: int) -> tuple[Sweep, Experiment, Any] | None:
        """Claim the next experiment for `slot`: queued first (priority, FIFO), then proposed.

        Asking a proposer (a language model may take many seconds) happens outside the pick
        lock, one proposer call per sweep at a time, so other slots and `claims_paused()` callers
        never wait on it.
        """
        tried: set[int] = set()
        while True:
            with self._pick_lock:
                if self._stopping.is_set():
                    return None
                proposable = []
                # queued work of any sweep before proposing
                for sweep, may_propose in self._open_sweeps():
                    loop = self._usable_loop(sweep, slot)  # before claiming anything
                    if loop is None:
                        continue
                    exp = (claim_queued(self.store, sweep) if may_propose
                           else claim_continuation(self.store, sweep))
                    if exp is not None:
                        return self._register_claim(slot, sweep, exp, loop)
                    if may_propose:
                        proposable.append((sweep, loop))
                chosen = self._choose_proposer([u for u in proposable if u[0].id not in tried])
                if chosen is None:
                    return None
            sweep, loop = chosen
            tried.add(sweep.id)
            picked = self._propose(slot, sweep, loop)
            if picked is not None:
                return picked

    def _propose(self, slot: int, sweep: Sweep, loop: Any) -> tuple[Sweep, Experiment, Any] | None:
        try:
            queued = loop.propose(sweep)
        except Exception as exc:  # nothing was queued or claimed
            if not self.disk_space.note_failure(exc, f"sweep {sweep.name}'s proposer"):
                logger.exception("sweep %s: asking its proposer failed", sweep.name)
            self._pause_sweep(sweep, f"asking its proposer failed: {exc}", exc)
            return None
        finally:
            with self._state_lock:
                self._proposing.discard(sweep.id)
        with self._pick_lock:
            if queued is None:
                if not self.store.count_experiments(
                        sweep.id, [ExperimentStatus.RUNNING, ExperimentStatus.QUEUED]):
                    finish_sweep(self.store, sweep, "no more proposals")
                return None
            if self._stopping.is_set():  # shut down while proposing: it stays queued
                return None
            current = self.store.get_sweep(sweep.name)
            if self._gate(current).kind is not GateKind.START:
                return None  # a limit or a pause came meanwhile: it stays queued
            exp = self.store.claim(queued.id)
            return self._register_claim(slot, current, exp, loop) if exp is not None else None

    def _open_sweeps(self) -> list[tuple[Sweep, bool]]:
        """The sweeps that may start an experiment now, each with whether it may ask for a
        new proposal (False: at its max, it only finishes what it started)."""
        open_sweeps = []
        # Only running sweeps: a year of finished nights is not read on every pick.
        for sweep in self.store.list_sweeps([SweepStatus.RUNNING]):
            if self._only_sweeps is not None and sweep.name not in self._only_sweeps:
                continue
            verdict = self._gate(sweep)
            if verdict.kind is GateKind.FINISH:
                if verdict.at_max and continuations(self.store, sweep):
                    open_sweeps.append((sweep, False))
                else:
                    finish_sweep(self.store, sweep, verdict.reason)
            elif verdict.kind is GateKind.START:
                open_sweeps.append((sweep, True))
        return open_sweeps

    def _choose_proposer(self, proposable: list[tuple[Sweep, Any]]) -> tuple[Sweep, Any] | None:
        """The first open sweep with a proposer that nobody is asking right now (marked busy)."""
        for sweep, loop in proposable:
            if sweep.baseline_metric is None:
                continue  # nothing is proposed before the baseline is in
            with self._state_lock:
                if sweep.id in self._proposing:
                    continue
            if loop.proposer is None:
                continue  # a queue-only sweep waits for POST /experiments
            with self._state_lock:
                self._proposing.add(sweep.id)
            return sweep, loop
        return None

    def _register_claim(self, slot: int, sweep: Sweep, exp: Experiment,
                        loop: Any) -> tuple[Sweep, Experiment, Any]:
        claim = _Claim(slot, loop)
        with self._state_lock:
            if exp.id in self._cancel_requests:  # cancelled between the claim and now
                self._cancel_requests.discard(exp.id)
                claim.stop.set()
            self._running[exp.id] = claim
        logger.info("slot %d: experiment %s of %s", slot, exp.id, sweep.name)
        return sweep, exp, loop

    def _pause_sweep(self, sweep: Sweep, why: str, exc: BaseException | None = None) -> None:
        """A sweep that cannot run (target gone, proposer unloadable, its runs refused by the
        executor) waits for its owner instead of failing on every tick; resuming it tries
        again. A lack of space (`exc`) pauses nothing in the database: the engine waits it out
        (self.disk_space) and goes on by itself."""
        if self._stopping.is_set() or (exc is not None and self.disk_space.note_failure(
                exc, f"sweep {sweep.name}", probe=True)):
            return  # a shutdown's side effects (or a full disk) are not the sweep's fault
        logger.error("sweep %s paused: %s; fix the problem, then resume the sweep", sweep.name,
                     why)
        try:
            self.store.set_sweep_status(sweep.name, SweepStatus.PAUSED)
        except (ConflictError, NotFoundError):
            pass  # stopped or deleted meanwhile

    def _usable_loop(self, sweep: Sweep, slot: int) -> Any:
        """The sweep's loop for `slot`, or None (sweep paused) when it cannot be built."""
        try:
            return self._loop(sweep, slot)
        except Exception as exc:
            self._pause_sweep(sweep, f"cannot set up its runs: {exc}", exc)
            return None

    def _loop(self, sweep: Sweep, slot: int) -> Any:
        key = (sweep.id, slot)
        with self._state_lock:
            loop = self._loops.get(key)
        if loop is None:
            loop = self.loop_factory(sweep, slot)
            with self._state_lock:
                self._loops[key] = loop
        return loop

