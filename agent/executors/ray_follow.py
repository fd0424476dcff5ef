"""Following one submitted Ray task to its end: lines back, stop, deadline backstop, result.

Used by agent.executors.ray (which submits the task and owns the connection). Lines drained
from the channel actor go to the local log file and the line callback; a stop is asked of the
worker through the channel (or, with no channel or no worker yet, by a plain `ray.cancel`); a
worker that has not ended the run `grace_s + stop_wait_s` after the stop, or `backstop_s` past
its deadline, is force-cancelled and its node swept for the run's processes by their
OVERNIGHT_RUN_ID. A task that died with its worker or node raises WorkerLostError.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.core.errors import WorkerLostError
from agent.executors.remote_run import RemoteOutcome, RemoteRequest
from runner.result import Outcome, RunResult, last_error_line, tail_lines
from runner.summary import has_fail_marker, parse_summary
from runner.tree import RUN_ID_ENV, kill_by_run_id

logger = logging.getLogger(__name__)

POLL_S = 0.5  # how often lines are drained and the stop/deadline looked at (the end: at once)
SWEEP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Link:
    """What following a task needs from the executor."""

    ray: Any  # the connected ray module
    task: Any  # the remote function (agent.executors.ray._remote_task with its options)
    channel: Any  # the channel actor's handle
    renew: Callable[[Any], Any]  # renew(dead channel) -> a live one for later runs
    grace_s: float
    stop_wait_s: float
    backstop_s: float


class Follow:
    """One submitted task, followed to its end: lines, stop, deadline, result."""

    def __init__(self, link: Link, request: RemoteRequest, log_path: Path,
                 on_line: Callable[[str], None] | None, stop: threading.Event | None) -> None:
        self.link, self.request, self.log_path = link, request, log_path
        self.on_line, self.stop = on_line, stop or threading.Event()
        self.ray, self.channel = link.ray, link.channel
        self.channel_lost = False
        self.token = uuid.uuid4().hex
        self.node: str | None = None
        self.ref: Any = None
        self.begun = time.monotonic()

    def run(self, bundle: bytes) -> RemoteOutcome | RunResult:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_bytes(b"")
        self.log_path.chmod(0o600)
        self.ref = self.link.task.remote(
            self.request, self.ray.put(bundle), self.channel, self.token)
        try:
            return self._follow()
        finally:
            if not self.channel_lost:
                self.channel.forget.remote(self.token)

    def _follow(self) -> RemoteOutcome | RunResult:
        started: float | None = None
        asked: float | None = None
        s = self.link
        while True:
            ready, _ = self.ray.wait([self.ref], timeout=POLL_S)
            self._drain()
            if ready:
                return self._collect()
            now = time.monotonic()
            if started is None and self.node is not None:
                started = now
            if self.stop.is_set() and asked is None:
                asked = now
                self.channel.stop.remote(self.token)
                if self.node is None or self.channel_lost:
                    # Not started yet (dropped), or no channel to ask through: Ray interrupts
                    # the task and the runner kills the tree as it unwinds.
                    self.ray.cancel(self.ref)
            if asked is not None and now - asked > s.grace_s + s.stop_wait_s:
                return self._force(Outcome.STOPPED, "the worker did not stop the run")
            if started is not None and now - started > (self.request.timeout_s + s.grace_s
                                                         + s.backstop_s):
                return self._force(Outcome.TIMED_OUT, "the worker overstayed the deadline")

    def _drain(self) -> None:
        if self.channel_lost:
            return
        try:
            lines, node = self.ray.get(self.channel.take.remote(self.token), timeout=30)
        except Exception as exc:  # the channel's node is gone: the result still comes
            logger.warning("cannot read the run's lines (the full log comes with its result): "
                           "%s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            self.channel_lost = True
            self.link.renew(self.channel)
            return
        self.node = self.node or node
        if not lines:
            return
        with self.log_path.open("a", encoding="utf-8") as log:
            log.writelines(line + "\n" for line in lines)
        for line in lines:
            if self.on_line is not None:
                try:
                    self.on_line(line)
                except Exception:
                    logger.exception("line callback failed")

    def _collect(self) -> RemoteOutcome | RunResult:
        from ray.exceptions import RayError, RayTaskError, TaskCancelledError

        try:
            outcome: RemoteOutcome = self.ray.get(self.ref)
        except TaskCancelledError:
            return self._synthesized(Outcome.STOPPED, None)
        except RayTaskError:
            raise  # our own code failed on the worker: a bug, not a lost machine
        except RayError as exc:
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise WorkerLostError(f"{type(exc).__name__}: {why}"[:300]) from exc
        self.log_path.write_bytes(outcome.log)
        return outcome

    def _force(self, outcome: Outcome, why: str) -> RunResult:
        """Kill the task from here and sweep its node for the run's processes."""
        logger.warning("run %s: %s; force-cancelling its Ray task", self.token[:8], why)
        self.ray.cancel(self.ref, force=True)
        self._drain()  # the lines that made it back
        run_id = self.request.env.get(RUN_ID_ENV)
        if self.node is not None and run_id:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            sweep = self.ray.remote(_sweep_node).options(
                num_cpus=0, max_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(self.node, soft=False))
            try:
                self.ray.get(sweep.remote(run_id), timeout=SWEEP_TIMEOUT_S)
            except Exception as exc:  # the node is gone: so are its processes
                logger.warning("run %s: cannot sweep its node: %s", self.token[:8], exc)
        return self._synthesized(outcome, why)

    def _synthesized(self, outcome: Outcome, why: str | None) -> RunResult:
        """A result from the lines that came back, for a task that returned none."""
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return RunResult(outcome=outcome, exit_code=None, signal=None,
                         wall_s=time.monotonic() - self.begun, summary=parse_summary(text),
                         fail_marker=has_fail_marker(text), log_path=self.log_path,
                         log_tail=tail_lines(text), pgid=None,
                         error=last_error_line(text) or why)


def _sweep_node(run_id: str) -> list[int]:
    """The Ray task that kills what is left of a run on its node, by OVERNIGHT_RUN_ID."""
    return kill_by_run_id(run_id)
