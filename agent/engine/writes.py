"""Writes that fail for lack of space: the engine pauses and retries them until they succeed.

A full disk (the database's, or the work dir's with the runs' logs and worktrees) is nobody's
verdict: the engine holds one `DiskSpaceWatch` for it instead of failing the experiment, the
sweep or the slot. Guaranteed:
- `retry_while_disk_full(fn)` runs a write the engine must not lose (a run's end, a verdict, a
  keep's branch move, a retry row); while it fails for lack of space it is tried again with
  backoff (the result waits in memory; the run's log and summary are on disk already) until it
  succeeds, or the engine stops (then it raises, and restart recovery takes over).
- While failing, slots start nothing new (`wait_writable`): the state ends only when the probes
  (a write to the database and one to the work dir) succeed again, with a log line; no sweep is
  paused in the database, so nothing needs resuming by hand.
- During a run (`best_effort()`) writes are best effort: a run never waits on the disk.
- `space_waiting_store` / `space_checking_runner` wrap the engine's Store and Runner with these
  rules, so the loop itself knows nothing of them; a run that failed while writes fail for lack
  of space raises OutOfSpaceError (the disk ended it, not the change).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar, cast

from agent.core.domain import utcnow
from agent.core.errors import OutOfSpaceError, OvernightError, is_out_of_space, says_out_of_space
from agent.core.ports import Runner, Store
from runner.result import Outcome, RunResult

logger = logging.getLogger(__name__)
T = TypeVar("T")

FIRST_WAIT_S = 0.5  # the first retry; each later one waits twice as long, up to MAX_WAIT_S
MAX_WAIT_S = 30.0
# The work dir's probe. Far more than the few pages a failed write frees again (git removes a
# half-written checkout), so a disk that is still full never passes it.
PROBE_BYTES = 4 << 20
PROBE_CHUNK = 64 << 10
# A state that comes back this soon after it ended carries on its backoff: a disk that has just
# enough room for the probes but not for the work retries ever more slowly, not every second.
REENTRY_S = 120.0
PROBE_NAME = ".overnight-write-check"

Probe = Callable[[], None]  # raises when it cannot write


@dataclass(frozen=True)
class Failing:
    since: datetime
    reason: str


def probe_folder(folder: Path) -> None:
    """Write (and delete) PROBE_BYTES in `folder`: OSError (ENOSPC) when it cannot."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f"{PROBE_NAME}-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(probe, "wb", buffering=0) as fh:
            chunk = b"\0" * PROBE_CHUNK
            for _ in range(PROBE_BYTES // PROBE_CHUNK):
                fh.write(chunk)
            os.fsync(fh.fileno())
    finally:
        with contextlib.suppress(FileNotFoundError):
            probe.unlink()


class DiskSpaceWatch:
    """Whether the engine's writes fail for lack of space, and the waiting that follows."""

    def __init__(self, probes: Sequence[Probe] = (), first_wait_s: float = FIRST_WAIT_S,
                 max_wait_s: float = MAX_WAIT_S) -> None:
        self._probes = tuple(probes)
        self._first_wait_s, self._max_wait_s = first_wait_s, max_wait_s
        self._lock = threading.Lock()
        self._failing: Failing | None = None
        self._next_probe_at = 0.0  # monotonic time of the next probe while failing
        self._wait_s = first_wait_s
        self._ended_at = -REENTRY_S  # monotonic time the state last ended
        self._stopped = threading.Event()
        self._local = threading.local()

    @property
    def failing(self) -> Failing | None:
        """Since when and why writes fail (None: they succeed)."""
        return self._failing

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def stop(self) -> None:
        """The engine is stopping: retried writes give up at their next failure."""
        self._stopped.set()

    def note_failure(self, exc: BaseException, what: str = "", probe: bool = False) -> bool:
        """Note a failed write; True when it failed for lack of space (the state is entered).
        With `probe`, an error that does not say why (git's "unable to write file" says no
        more) counts when the probes fail for lack of space now; the service's own errors
        (OvernightError: a conflict, a missing row) never need a probe."""
        if not is_out_of_space(exc) and not (
                probe and isinstance(exc, Exception) and not isinstance(exc, OvernightError)
                and not self.probe_now(f"{what}: {exc}"[:200] if what else str(exc)[:200])):
            return False
        with self._lock:
            if self._failing is None:
                reason = f"{what}: {exc}" if what else str(exc)
                self._failing = Failing(utcnow(), reason[:300])
                now = time.monotonic()
                if now - self._ended_at > REENTRY_S:
                    self._wait_s = self._first_wait_s
                self._next_probe_at = now + self._wait_s
                logger.error("writes fail for lack of space (%s); the engine keeps what it has "
                             "in memory, starts nothing new and goes on by itself once writes "
                             "succeed", reason[:300])
        return True

    def probe_when_due(self, force: bool = False) -> bool:
        """While failing, run the probes when due (backoff); True once writes succeed."""
        with self._lock:
            failing = self._failing
            if failing is None:
                return True
            now = time.monotonic()
            if not force and now < self._next_probe_at:
                return False
            self._next_probe_at = now + self._wait_s
            self._wait_s = min(self._wait_s * 2, self._max_wait_s)
        try:
            for probe in self._probes:
                probe()
        except Exception as exc:  # noqa: BLE001 - any failure means: not writable yet
            logger.debug("writes still fail: %s", exc)
            return False
        with self._lock:
            if self._failing is failing:
                self._failing = None
                self._ended_at = time.monotonic()
                lasted = (utcnow() - failing.since).total_seconds()
                logger.warning("writes succeed again after %.0f s without space; the engine "
                               "goes on (recording what it held, then starting new work)",
                               lasted)
        return True

    def probe_now(self, what: str = "") -> bool:
        """Probe now, whatever the backoff; False (and the state entered) when writes fail for
        lack of space. Other failures are not this state's business (True)."""
        try:
            for probe in self._probes:
                probe()
        except Exception as exc:  # noqa: BLE001 - a probe may fail in any way
            return not self.note_failure(exc, what)
        return True

    def wait_writable(self, stop: threading.Event, poll_s: float = 1.0) -> None:
        """Return once writes succeed (or `stop` is set); an idle slot's wait while failing."""
        while not stop.is_set() and not self.probe_when_due():
            stop.wait(max(0.05, min(poll_s, self._wait_s)))

    def retry_while_disk_full(self, fn: Callable[[], T], what: str = "") -> T:
        """`fn()`, tried again with backoff while it fails for lack of space (see the module
        docstring); inside `best_effort()` or once stopped, it fails at once (noted)."""
        wait = self._first_wait_s
        tried = False
        while True:
            try:
                value = fn()
            except Exception as exc:
                if (not self.note_failure(exc, what, probe=True) or self._stopped.is_set()
                        or getattr(self._local, "best_effort", False)):
                    raise
                logger.debug("holding %s until writes succeed: %s", what, exc)
                if self._stopped.wait(wait):
                    raise
                wait, tried = min(wait * 2, self._max_wait_s), True
                continue
            if tried:
                self.probe_when_due(force=True)
            return value

    @contextlib.contextmanager
    def best_effort(self) -> Iterator[None]:
        """Writes in this block (this thread) are best effort: a failure raises at once."""
        before = getattr(self._local, "best_effort", False)
        self._local.best_effort = True
        try:
            yield
        finally:
            self._local.best_effort = before


class _SpaceWaitingStore:
    """A Store whose every call waits out a lack of space
    (DiskSpaceWatch.retry_while_disk_full)."""

    def __init__(self, store: Store, disk_space: DiskSpaceWatch) -> None:
        self.inner, self._disk_space = store, disk_space

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if not callable(value) or name == "reading":
            return value

        def retried(*args: Any, **kwargs: Any) -> Any:
            return self._disk_space.retry_while_disk_full(lambda: value(*args, **kwargs), name)

        return retried


def space_waiting_store(store: Store, disk_space: DiskSpaceWatch) -> Store:
    """`store` with every call retried through a lack of space (reads never fail for it)."""
    if isinstance(store, _SpaceWaitingStore):
        return store
    return cast(Store, _SpaceWaitingStore(store, disk_space))


class _SpaceCheckingRunner:
    """Runs with best-effort writes; a run that failed while writes fail for lack of space
    raises OutOfSpaceError."""

    def __init__(self, runner: Runner, disk_space: DiskSpaceWatch) -> None:
        self.inner, self._disk_space = runner, disk_space

    def run(self, argv: list[str], **kwargs: Any) -> RunResult:
        with self._disk_space.best_effort():
            result = self.inner.run(argv, **kwargs)
        if result.ok or result.outcome in (Outcome.STOPPED, Outcome.TIMED_OUT):
            return result
        said = says_out_of_space(result.error) or says_out_of_space(result.log_tail)
        watch = self._disk_space
        if said or watch.failing is not None or not watch.probe_now("after a run"):
            how = result.error or f"{result.outcome.value}, exit code {result.exit_code}"
            raise OutOfSpaceError(f"the run failed ({how}) while writes failed for lack of "
                                  "space")
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def space_checking_runner(runner: Runner, disk_space: DiskSpaceWatch) -> Runner:
    return cast(Runner, _SpaceCheckingRunner(runner, disk_space))
