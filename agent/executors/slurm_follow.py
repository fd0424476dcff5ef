"""Following Slurm jobs to their end: one squeue for all of them, lines back, stop, result.

Used by agent.executors.slurm (which submits the jobs). `JobBoard` asks squeue for every job of
this process in one call, every 0.5 s after a change and backing off to every 10 s while nothing
changes. `JobFollow` follows one job: its log lines go to the local log file and the line
callback as they are written; a stop is a scancel (the job's half ends the run's whole tree
after the grace); a job that overstays its deadline by `backstop_s` is cancelled from here.

How it ended is read from the job's own result file first, and Slurm's word only where that file
cannot say: a signal the coordinator did not send, or no file at all. A job Slurm requeued,
preempted or lost with its node raises WorkerLostError (the change is not at fault: it runs
again); Slurm's time limit is a timeout, a cancel from outside a cancel. A job that ended
without its half ever writing a result (the node could not run it) raises SlurmJobError, a
RunNotStartedError.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from agent.core.errors import RunNotStartedError, WorkerLostError
from agent.executors import slurm_cli
from agent.executors.slurm_cli import JobState, SlurmError
from agent.executors.slurm_job import ENDED_BY_ITSELF, JobFiles, result_of
from runner.logtail import LogTailer, read_log_end
from runner.result import Outcome, RunResult, last_error_line, tail_lines
from runner.summary import has_fail_marker, parse_summary

logger = logging.getLogger(__name__)

POLL_S = 0.2  # how often a job's log and result file are read
BOARD_MIN_S = 0.5  # squeue's interval after a change; doubled while nothing changes, up to:
BOARD_MAX_S = 10.0
RESULT_WAIT_S = 30.0  # a job Slurm says has ended: how long its result file may take to show
LOST = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "REQUEUED", "REQUEUE_HOLD",
                  "REQUEUE_FED", "REVOKED", "SPECIAL_EXIT"})
TIMED_OUT = frozenset({"TIMEOUT", "DEADLINE"})


class SlurmJobError(RunNotStartedError):
    """A job ended without overnight's half of it ever writing a result: the node could not
    run it (the work dir or the interpreter not there), so the run never started. Not the
    change's fault: it is recorded `not started` and the sweep pauses with the reason."""


class JobBoard:
    """The squeue states of the jobs being followed, refreshed by one thread for all."""

    def __init__(self, name_prefix: str, tick: Callable[[], None] | None = None) -> None:
        self.name_prefix, self.tick = name_prefix, tick
        self._states: dict[str, JobState] = {}
        self._watched: dict[str, float] = {}  # job id -> when it was submitted (monotonic)
        self._queried_at = 0.0  # the start of the last successful squeue
        self._cond = threading.Condition()
        self._query_lock = threading.Lock()
        self._interval = BOARD_MIN_S
        self._thread: threading.Thread | None = None
        self._closed = False
        self._failing = False

    def watch(self, job_id: str) -> None:
        with self._cond:
            self._watched[job_id] = time.monotonic()
            self._interval = BOARD_MIN_S
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="overnight-squeue",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def forget(self, job_id: str) -> None:
        with self._cond:
            self._watched.pop(job_id, None)
            self._states.pop(job_id, None)

    def watched(self) -> list[str]:
        with self._cond:
            return list(self._watched)

    def state(self, job_id: str) -> tuple[JobState | None, bool]:
        """The job's last state, and whether squeue has answered since it was submitted (so a
        job it does not list has ended and been purged)."""
        with self._cond:
            since = self._watched.get(job_id, 0.0)
            return self._states.get(job_id), self._queried_at > since

    def refresh(self) -> None:
        """Ask squeue now (one call for every job; a failure keeps the states it had)."""
        with self._query_lock:
            began = time.monotonic()
            try:
                found = slurm_cli.jobs(self.name_prefix)
            except (SlurmError, OSError) as exc:
                if not self._failing:
                    logger.warning("cannot read the Slurm queue (trying again): %s", exc)
                self._failing = True
                return
            if self._failing:
                logger.warning("the Slurm queue answers again")
            self._failing = False
            with self._cond:
                changed = any(self._states.get(i) != found.get(i) for i in self._watched)
                self._states = {i: s for i, s in found.items() if i in self._watched}
                self._queried_at = began
                self._interval = (BOARD_MIN_S if changed
                                  else min(self._interval * 2, BOARD_MAX_S))
                self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait(self._interval)
                if self._closed:
                    return
                busy = bool(self._watched)
            if busy:
                self.refresh()
            if self.tick is not None:
                try:
                    self.tick()
                except Exception:
                    logger.exception("the Slurm executor's periodic check failed")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class JobFollow:
    """One submitted (or adopted) job, followed to its end: lines, stop, deadline, result."""

    def __init__(self, board: JobBoard, files: JobFiles, job_id: str, log_path: Path,
                 on_line: Callable[[str], None] | None, stop: threading.Event | None,
                 timeout_s: float, grace_s: float, backstop_s: float) -> None:
        self.board, self.files, self.job_id, self.log_path = board, files, job_id, log_path
        self.on_line, self.stop = on_line, stop or threading.Event()
        self.limit_s = timeout_s + grace_s + backstop_s
        self.asked: Outcome | None = None  # what this side asked of the job (stop, timeout)
        self.started: float | None = None  # when squeue first said RUNNING
        self.restarts: int | None = None  # Slurm's restart count when first seen
        self.ended: float | None = None  # when Slurm first said it had ended
        self.begun = time.monotonic()
        self.tailer = LogTailer(files.log, None)

    def run(self) -> RunResult:
        """The run's result. Raises WorkerLostError or SlurmJobError (module docstring)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a", encoding="utf-8") as live:
            live.truncate(0)
            self.log_path.chmod(0o600)

            def line(text: str) -> None:
                live.write(text + "\n")
                live.flush()
                if self.on_line is not None:
                    self.on_line(text)

            self.tailer = LogTailer(self.files.log, line)
            return self._follow()

    def _follow(self) -> RunResult:
        while True:
            if self.files.log.exists():  # the job has started
                self.tailer.poll()
            record = self.files.read_result()
            if record is not None and (record.get("ended_by") == ENDED_BY_ITSELF or self.asked):
                return self._collect(record)
            state, answered = self.board.state(self.job_id)
            self._note(state)
            self._ask()
            gone = answered and (state is None or not state.alive)
            if record is not None or gone:
                judged = self._judge(state, record is not None)
                if judged is not None:
                    return judged
            time.sleep(POLL_S)

    def _note(self, state: JobState | None) -> None:
        """Start the deadline at RUNNING; a restart count that grew means Slurm requeued it."""
        if state is None:
            return
        if self.restarts is None:
            self.restarts = state.restarts
        if state.state == "RUNNING" and self.started is None:
            self.started = time.monotonic()
        if state.restarts > self.restarts:
            self._lost(_lost_why(self.job_id, state))

    def _ask(self) -> None:
        """A stop or an overstayed deadline: scancel (the job's half ends the run's tree)."""
        if self.asked is not None:
            return
        if self.stop.is_set():
            self.asked = Outcome.STOPPED
        elif self.started is not None and time.monotonic() - self.started > self.limit_s:
            logger.warning("Slurm job %s overstayed its deadline; cancelling it", self.job_id)
            self.asked = Outcome.TIMED_OUT
        else:
            return
        slurm_cli.cancel([self.job_id])
        self.board.refresh()

    def _judge(self, state: JobState | None, has_record: bool) -> RunResult | None:
        """How a job ended that left no result of its own ending: by what this side asked,
        else by Slurm's word; None while that word may still change."""
        now = time.monotonic()
        if self.ended is None:
            self.ended = now
            self.board.refresh()
            state, _ = self.board.state(self.job_id)
            self._note(state)
        waited = now - self.ended > RESULT_WAIT_S
        if self.asked is not None:  # its result, if it ran, is on its way
            return self._synthesized(self.asked, None) if waited or not self.started else None
        name = state.state if state is not None else None
        if state is not None and (name in LOST or (name == "PENDING" and has_record)):
            self._lost(_lost_why(self.job_id, state))
        if name in TIMED_OUT:
            return self._synthesized(Outcome.TIMED_OUT, f"Slurm's time limit ended job "
                                     f"{self.job_id} ({name})")
        if name == "CANCELLED":
            return self._synthesized(Outcome.STOPPED, f"job {self.job_id} was cancelled in "
                                     "Slurm (scancel)")
        if name == "OUT_OF_MEMORY":
            result = self._synthesized(Outcome.SIGNALED, f"out of memory: Slurm ended job "
                                       f"{self.job_id} (OUT_OF_MEMORY)")
            return replace(result, signal=9)
        if not waited:
            return None  # the result file may still be on its way (a shared filesystem)
        if has_record or state is None:
            self._lost(f"job {self.job_id} ended by a signal Slurm gives no reason for"
                       if has_record else f"job {self.job_id} left Slurm without a result")
        output = read_log_end(self.files.output)[-2000:].strip()
        raise SlurmJobError(
            f"Slurm job {self.job_id} on {state.nodes or 'its node'} ended {name} without "
            f"running overnight's half of it (no {self.files.result.name}); its output: "
            f"{output or '(none)'}. The nodes must see {self.files.root} and this machine's "
            "interpreter at the same paths")

    def _lost(self, why: str) -> NoReturn:
        slurm_cli.cancel([self.job_id])  # a requeued copy must not run as well
        logger.warning("%s: the run is interrupted and runs again", why)
        raise WorkerLostError(why)

    def _last_lines(self) -> None:
        """Deliver the job's last lines, then make the local log the job's own file."""
        if self.files.log.exists():
            self.tailer.flush()
            shutil.copyfile(self.files.log, self.log_path)

    def _collect(self, record: dict[str, Any]) -> RunResult:
        self._last_lines()
        result = result_of(record, self.log_path)
        if record.get("ended_by") != ENDED_BY_ITSELF and self.asked is not None:
            return replace(result, outcome=self.asked)
        return result

    def _synthesized(self, outcome: Outcome, why: str | None) -> RunResult:
        """A result from the lines the job wrote, for a job that wrote none."""
        self._last_lines()
        text = read_log_end(self.log_path)
        return RunResult(outcome=outcome, exit_code=None, signal=None,
                         wall_s=time.monotonic() - (self.started or self.begun),
                         summary=parse_summary(text), fail_marker=has_fail_marker(text),
                         log_path=self.log_path, log_tail=tail_lines(text), pgid=None,
                         error=last_error_line(text) or why)


def _lost_why(job_id: str, state: JobState) -> str:
    """Why Slurm took a job from under its run, in words."""
    if state.state == "PREEMPTED":
        return f"Slurm preempted job {job_id}"
    if state.state in ("NODE_FAIL", "BOOT_FAIL"):
        return f"the node of Slurm job {job_id} failed ({state.state})"
    if state.restarts or state.state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
        return f"Slurm requeued job {job_id} ({state.state}, {state.reason})"
    return f"Slurm ended job {job_id} ({state.state}, {state.reason})"
