"""The night mirrored to an experiment tracker (MLflow or W&B) without ever delaying it.

`on_event` (the engine's event callback) only puts the sweep of a finished experiment on a
bounded queue; a full queue drops the event (the next sync of that sweep catches up, since a
sync logs whatever the ledger says the tracker lacks). One thread reads the queue and syncs
the sweep, each tracker call retried with exponential backoff (agent.core.retry) while the
tracker is down or slow; when the retries run out the ledger records the error (the dashboard
and `overnight status` show the tracker behind), the failure is logged once until the tracker
works again, later calls are tried once each, and every `poll_s` the sweeps left behind are
synced again. The same poll notices a sweep's end, so its parent run gets the final numbers.
`close` waits a bounded time for what is queued, trying each call once: a tracker that is down
costs the end of the night nothing either.

Which sweeps: `track` (the --track choice) names one tracker for every sweep, or OFF for
none; without it a sweep is mirrored to the tracker of its own [track] table, if any.

One sweep brought up to date in one tracker, synchronously (`sync_sweep`: what the mirror's
thread does after each event and what `overnight export` does once): the ledger
(db.track_marks) says what the tracker already holds, the sweep's parent run and each
experiment's child run with the verdict it was sent. A sync opens the parent run if it has
none, logs every finished experiment it lacks, in id order, marking each once the tracker has
it (so a sync stopped half-way, by a failure or a kill, goes on where it stopped and never logs
one twice), and once the sweep is finished sends the verdicts that moved since (a verdict's
interval and P(better) move as the incumbent is re-measured), then the sweep's own numbers,
and closes the parent. Every tracker call goes through `call` (the retries). What a tracker is
sent is agent.ops.track_record's; the trackers are agent.ops.track_mlflow and
agent.ops.track_wandb, each imported only when a sweep is mirrored to it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Protocol

from agent.analysis.evidence import sweep_evidence
from agent.core.domain import Experiment, Sweep, SweepStatus
from agent.core.ports import Store
from agent.core.retry import retry
from agent.core.tracking import TrackTable
from agent.ops.track_record import (
    ExperimentRecord,
    SweepRecord,
    TrackerError,
    experiment_record,
    sweep_record,
    verdict,
)

# --- one sweep brought up to date -------------------------------------------------------------
Call = Callable[[Callable[[], object]], object]  # a tracker call, with the retries
Light = Callable[[Sweep], list[Experiment]]  # a sweep's experiments without diffs or logs


class Tracker(Protocol):
    """An experiment tracker (agent.ops.track_mlflow, agent.ops.track_wandb). Each call is
    idempotent for the same record: a call tried again finds what the first one made."""

    destination: str  # which tracker, where (no secret): the ledger's key

    def check(self) -> None:
        """Reach the tracker; TrackerError naming the problem if it cannot be reached."""

    def open_sweep(self, rec: SweepRecord) -> str:
        """The sweep's parent run (made, or found and reopened): its id."""

    def log_experiment(self, parent: str, rec: ExperimentRecord) -> str:
        """One experiment as a child run of `parent`, finished: its id."""

    def update_verdict(self, parent: str, remote_id: str, experiment_id: int,
                       numbers: dict[str, float]) -> None:
        """The child run's verdict numbers set to `numbers`."""

    def close_sweep(self, parent: str, rec: SweepRecord) -> None:
        """The sweep's numbers on the parent run, and the parent ended."""

    def close(self) -> None:
        """Let go of what is open (the process ends)."""


@dataclass(frozen=True)
class Mirrored:
    """What the ledger says a tracker holds of one sweep."""

    parent: str | None = None
    closed: bool = False
    experiments: dict[int, tuple[str, dict[str, float]]] = field(default_factory=dict)


class TrackLedger(Protocol):
    def mirrored(self, sweep_id: int, destination: str) -> Mirrored: ...

    def follow(self, sweep_id: int, destination: str) -> None:
        """The tracker is to hold the sweep (before its first call: a slow tracker shows
        behind from the start)."""

    def mark_sweep(self, sweep_id: int, destination: str, remote_id: str,
                   closed: bool) -> None:
        """The parent run is there (and ended when `closed`); clears the error."""

    def mark_experiment(self, sweep_id: int, destination: str, experiment_id: int,
                        remote_id: str, sent: dict[str, float]) -> None:
        """The experiment's child run is there with the verdict `sent`."""

    def failed(self, sweep_id: int, destination: str, error: str) -> None:
        """The last sync stopped on `error` (the dashboard shows the tracker behind)."""


@dataclass
class SyncReport:
    logged: int = 0
    updated: int = 0
    closed: bool = False


def sync_sweep(sweep: Sweep, tracker: Tracker, ledger: TrackLedger, store: Store, *,
               light: Light, base_url: str, call: Call) -> SyncReport:
    """Bring `tracker` up to date with `sweep` (see the module docstring)."""
    dest, out = tracker.destination, SyncReport()
    marks = ledger.mirrored(sweep.id, dest)
    exps = light(sweep)
    finished = [e for e in exps if e.status.is_finished()]
    pending = [e for e in finished if e.id not in marks.experiments]
    ending = sweep.status.is_finished()
    if marks.parent is not None and not pending and (marks.closed or not ending):
        return out
    if marks.parent is None:
        ledger.follow(sweep.id, dest)
    ev = sweep_evidence(sweep, exps, store.run_metrics(sweep.id))
    parent = marks.parent
    if parent is None or (marks.closed and pending):
        rec = sweep_record(sweep, ev, base_url)
        parent = str(call(partial(tracker.open_sweep, rec)))
        ledger.mark_sweep(sweep.id, dest, parent, closed=False)
    for e in pending:
        full = store.get_experiment(e.id)
        one = experiment_record(sweep, full, store.list_runs(experiment_id=e.id),
                                ev.experiments.get(e.id), base_url)
        remote = str(call(partial(tracker.log_experiment, parent, one)))
        ledger.mark_experiment(sweep.id, dest, e.id, remote, one.verdict)
        out.logged += 1
    if not ending:
        return out
    for e in finished:
        if e.id not in marks.experiments:
            continue
        remote, sent = marks.experiments[e.id]
        now = verdict(sweep, e, ev.experiments.get(e.id))
        if now != sent:
            call(partial(tracker.update_verdict, parent, remote, e.id, now))
            ledger.mark_experiment(sweep.id, dest, e.id, remote, now)
            out.updated += 1
    final = sweep_record(sweep, ev, base_url)
    call(partial(tracker.close_sweep, parent, final))
    ledger.mark_sweep(sweep.id, dest, parent, closed=True)
    out.closed = True
    return out


# --- the mirror -------------------------------------------------------------------------------
logger = logging.getLogger(__name__)
QUEUE_SIZE = 256
OFF: Literal["off"] = "off"
DEFAULT_DASHBOARD = "http://127.0.0.1:8000"
Choice = TrackTable | Literal["off"] | None


def make_tracker(table: TrackTable, timeout_s: float = 10.0) -> Tracker:
    """The tracker `table` names (its package imported now); TrackerError if not installed."""
    if table.to == "mlflow":
        from agent.ops.track_mlflow import MlflowTracker

        return MlflowTracker(table.experiment, timeout_s)
    from agent.ops.track_wandb import WandbTracker

    return WandbTracker(table.experiment, timeout_s)


@dataclass(frozen=True)
class MirrorStatus:
    queued: int
    dropped: int
    failing: dict[str, str]  # destination → the last error


class Mirror:
    """The engine's queue and the thread that syncs each sweep it names (module docstring)."""

    def __init__(self, store: Store, ledger: TrackLedger, *, track: Choice = None,
                 base_url: str = DEFAULT_DASHBOARD, light: Light | None = None,
                 factory: Callable[[TrackTable], Tracker] = make_tracker, retries: int = 3,
                 backoff_s: float = 1.0, max_backoff_s: float = 30.0, poll_s: float = 5.0,
                 queue_size: int = QUEUE_SIZE) -> None:
        self.store, self.ledger, self.track, self.base_url = store, ledger, track, base_url
        self.light: Light = light or (lambda s: store.list_experiments(s.id))
        self.factory, self.retries, self.poll_s = factory, retries, poll_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.trackers: dict[tuple[str, str | None], Tracker] = {}
        self.queue: queue.Queue[int | None] = queue.Queue(maxsize=queue_size)
        self.followed: dict[int, SweepStatus] = {}  # sweep id → its status when last synced
        self.behind: set[int] = set()  # sweeps whose last sync failed
        self.failing: dict[str, str] = {}
        self.dropped = 0
        self.deadline: float | None = None
        self._closing = threading.Event()  # set by close: no more waits between retries
        self._broken: set[str] = set()  # trackers that cannot be made (logged once each)
        self._thread = threading.Thread(target=self._work, name="overnight-track", daemon=True)

    # --- the engine's side: never blocks --------------------------------------------------
    def on_event(self, kind: str, exp: Experiment, data: dict[str, Any]) -> None:
        if kind != "finished":
            return
        try:
            self.queue.put_nowait(exp.sweep_id)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                logger.warning("tracking: the queue is full; the sweep is synced again on the "
                               "next event or poll, the night goes on")

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> Mirror:
        """Follow the running and paused sweeps (what finished while no mirror ran is
        logged first), then start the thread."""
        for s in self.store.list_sweeps([SweepStatus.RUNNING, SweepStatus.PAUSED]):
            if self.table_for(s.config.track) is not None:
                self.queue.put_nowait(s.id)
        self._thread.start()
        return self

    def close(self, timeout_s: float = 15.0) -> None:
        """Sync what is queued and the followed sweeps once more (a sweep's end), each call
        tried once (no more waits between retries), for at most `timeout_s`; then let go of
        the trackers."""
        self.deadline = time.monotonic() + timeout_s
        self._closing.set()
        if self._thread.is_alive():
            try:
                self.queue.put(None, timeout=timeout_s)
                self._thread.join(max(0.0, self.deadline - time.monotonic()))
            except queue.Full:
                pass
        if self._thread.is_alive():
            logger.warning("tracking: still busy after %.0f s; what is not mirrored yet stays "
                           "behind (overnight export back-fills it)", timeout_s)
            return
        for tracker in self.trackers.values():
            tracker.close()

    def status(self) -> MirrorStatus:
        return MirrorStatus(self.queue.qsize(), self.dropped, dict(self.failing))

    # --- which tracker --------------------------------------------------------------------
    def table_for(self, own: TrackTable | None) -> TrackTable | None:
        if self.track == OFF:
            return None
        return self.track if self.track is not None else own

    def tracker_for(self, table: TrackTable) -> Tracker:
        key = (table.to, table.experiment)
        if key not in self.trackers:
            self.trackers[key] = self.factory(table)
        return self.trackers[key]

    # --- syncing --------------------------------------------------------------------------
    def export(self, sweep_name: str) -> SyncReport:
        """Sync one sweep now, in this thread, with the retries; TrackerError if it fails
        (what was mirrored before the failure stays marked: a second export goes on)."""
        sweep = self.store.get_sweep(sweep_name)
        table = self.table_for(sweep.config.track)
        if table is None:
            raise TrackerError(f"sweep {sweep_name}: no tracker named", retry=False)
        tracker = self.tracker_for(table)
        tracker.check()
        return sync_sweep(sweep, tracker, self.ledger, self.store, light=self.light,
                          base_url=table.dashboard_url or self.base_url,
                          call=self._call(tracker.destination, tries=self.retries + 1))

    def sync(self, sweep_id: int) -> bool:
        """Bring the sweep's tracker up to date; False (recorded, logged once) on failure."""
        sweep = self.store.get_sweep_by_id(sweep_id)
        table = self.table_for(sweep.config.track)
        if table is None:
            return True
        self.followed[sweep.id] = sweep.status
        try:
            tracker = self.tracker_for(table)
        except TrackerError as exc:
            if table.to not in self._broken:
                self._broken.add(table.to)
                logger.error("tracking: %s; sweep %s is not mirrored", exc, sweep.name)
            return False
        dest = tracker.destination
        try:
            sync_sweep(sweep, tracker, self.ledger, self.store, light=self.light,
                       base_url=table.dashboard_url or self.base_url, call=self._call(dest))
        except Exception as exc:  # noqa: BLE001 - a tracker's failure never ends the mirror
            why = str(exc) if isinstance(exc, TrackerError) else f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, TrackerError):
                logger.exception("tracking: syncing sweep %s failed", sweep.name)
            self._failed(sweep.id, dest, why)
            return False
        self.behind.discard(sweep.id)
        if sweep.status.is_finished():  # ended and closed: no more polls (an event of a
            self.followed.pop(sweep.id, None)  # resumed sweep follows it again)
        if self.failing.pop(dest, None) is not None:
            logger.warning("tracking to %s works again", dest)
        return True

    def _failed(self, sweep_id: int, dest: str, why: str) -> None:
        self.behind.add(sweep_id)
        if dest not in self.failing:
            logger.warning("tracking to %s failed (%s); the night goes on, what is not "
                           "mirrored is tried again, and further failures are not logged "
                           "until it works again", dest, why)
        self.failing[dest] = why
        try:
            self.ledger.failed(sweep_id, dest, why)
        except Exception:  # noqa: BLE001 - the database's own trouble is logged elsewhere
            logger.debug("tracking: recording the failure failed", exc_info=True)

    def _call(self, dest: str, tries: int | None = None) -> Call:
        def call(fn: Callable[[], object]) -> object:
            n = tries if tries is not None else 1 if dest in self.failing else self.retries + 1
            return retry(fn, tries=n, backoff_s=self.backoff_s,
                         max_backoff_s=self.max_backoff_s, pause=self._pause,
                         retryable=lambda e: isinstance(e, TrackerError) and e.retry,
                         failed=lambda k, e: logger.debug("tracking to %s: attempt %d "
                                                          "failed: %s", dest, k, e))
        return call

    def _pause(self, seconds: float) -> bool:
        """Wait before a retry; False (no retry) once closing: `close` ends a wait at once."""
        if self.deadline is not None and self.deadline - time.monotonic() <= seconds:
            return False
        return not self._closing.wait(seconds)

    # --- the worker -----------------------------------------------------------------------
    def _work(self) -> None:
        next_poll = time.monotonic() + self.poll_s
        while True:
            try:
                item: int | None | bool = self.queue.get(
                    timeout=max(0.0, next_poll - time.monotonic()))
            except queue.Empty:
                item = False  # nothing came: time to poll
            try:
                if item is None:  # closing: every followed sweep once more, then stop
                    for sweep_id in list(self.followed):
                        self.sync(sweep_id)
                    return
                if isinstance(item, int) and not isinstance(item, bool):
                    self.sync(item)
                if time.monotonic() >= next_poll:
                    self._poll()
                    next_poll = time.monotonic() + self.poll_s
            except Exception:  # noqa: BLE001 - a bad read must not end the mirror
                logger.exception("tracking: handling an event failed")

    def _poll(self) -> None:
        """Sync the sweeps left behind, and those whose status changed (their end)."""
        for sweep_id, seen in list(self.followed.items()):
            if sweep_id in self.behind or self.store.get_sweep_by_id(sweep_id).status != seen:
                self.sync(sweep_id)
