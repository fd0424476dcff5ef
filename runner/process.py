"""Run one command in its own process group under a hard wall-clock limit, logging to a file.

Stdlib only, POSIX only. Guaranteed: run_command never raises for a failing child (it returns a
RunResult); on return the child's whole process group has been sent SIGKILL and the child reaped;
the child writes its own log, so the log survives the parent dying. Not guaranteed: that
processes which left the group (setsid, daemonising) are killed, or that a recorded pgid still
names the same group later (kill_process_group trusts the caller's pgid).
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from runner.groups import (
    GROUP_POLL_S,
    KILL_WAIT_S,
    kill_process_group,
    process_group_alive,
    signal_group,
    wait_group_gone,
)
from runner.logtail import LogTailer, read_log_end
from runner.result import Outcome, RunResult, last_error_line, tail_lines
from runner.summary import has_fail_marker, parse_summary

logger = logging.getLogger(__name__)

__all__ = ["kill_process_group", "process_group_alive", "resolve_command", "run_command"]

PYTHON_NAMES = frozenset({"python", "python3"})
# A child stuck in uninterruptible sleep (say, in a GPU driver) survives SIGKILL for a while;
# past this we stop waiting for it rather than hang the caller.
REAP_TIMEOUT_S = 30.0


def resolve_command(command: str, python: str = sys.executable) -> list[str]:
    """shlex.split; a first word of 'python' or 'python3' becomes `python` (our interpreter)."""
    argv = shlex.split(command)
    if argv and argv[0] in PYTHON_NAMES:
        argv[0] = python
    return argv


def _child_exited(proc: subprocess.Popen[bytes]) -> bool:
    """True once the child has ended, without reaping it where the OS allows.

    Leaving the zombie in place keeps its pid, and so the group id, from being reused before
    we SIGKILL the group.
    """
    if proc.returncode is not None:
        return True
    if hasattr(os, "waitid"):
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return proc.poll() is not None
        return info is not None
    return proc.poll() is not None


def _wait_for_exit(proc: subprocess.Popen[bytes], seconds: float, tailer: LogTailer) -> bool:
    """Wait up to ``seconds`` for the child to end, following the log; True if it ended."""
    deadline = time.monotonic() + seconds
    while not _child_exited(proc):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(GROUP_POLL_S, remaining))
        tailer.poll()
    return True


def _kill_and_reap(proc: subprocess.Popen[bytes], pgid: int) -> None:
    """SIGKILL the whole group (gone already is fine), reap the child, wait for the rest."""
    signal_group(pgid, signal.SIGKILL)
    try:
        proc.wait(timeout=REAP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        logger.error("pid %d still not reaped %.0fs after SIGKILL", proc.pid, REAP_TIMEOUT_S)
    if not wait_group_gone(pgid, KILL_WAIT_S):
        logger.error("process group %d still alive %.0fs after SIGKILL", pgid, KILL_WAIT_S)


def _terminate(proc: subprocess.Popen[bytes], pgid: int, grace_s: float, tailer: LogTailer) -> None:
    """SIGTERM the group, give the child ``grace_s`` to end, then SIGKILL the group and reap."""
    signal_group(pgid, signal.SIGTERM)
    _wait_for_exit(proc, grace_s, tailer)
    _kill_and_reap(proc, pgid)


def _supervise(
    proc: subprocess.Popen[bytes],
    deadline: float,
    poll_s: float,
    stop_event: threading.Event | None,
    tailer: LogTailer,
) -> Outcome | None:
    """Poll until the child exits (None), the deadline passes or the caller asks to stop."""
    while True:
        tailer.poll()
        if _child_exited(proc):
            return None
        now = time.monotonic()
        if now >= deadline:
            return Outcome.TIMED_OUT
        if stop_event is not None and stop_event.is_set():
            return Outcome.STOPPED
        wait_s = min(poll_s, deadline - now)
        if stop_event is not None:
            stop_event.wait(wait_s)
        else:
            time.sleep(wait_s)


def _call_on_start(on_start: Callable[[int, int], None] | None, pid: int, pgid: int) -> None:
    if on_start is None:
        return
    try:
        on_start(pid, pgid)
    except Exception:
        logger.exception("on_start callback failed for pid %d", pid)


def _finish(
    outcome: Outcome, returncode: int | None, wall_s: float, log_path: Path, pgid: int | None
) -> RunResult:
    """Build the RunResult from how the child ended and the end of its log."""
    killed_by = -returncode if returncode is not None and returncode < 0 else None
    if outcome is Outcome.EXITED and killed_by is not None:
        outcome = Outcome.SIGNALED
    text = read_log_end(log_path)
    return RunResult(
        outcome=outcome,
        exit_code=returncode if outcome is Outcome.EXITED else None,
        signal=killed_by,
        wall_s=wall_s,
        summary=parse_summary(text),
        fail_marker=has_fail_marker(text),
        log_path=log_path,
        log_tail=tail_lines(text),
        pgid=pgid,
        error=last_error_line(text),
    )


def _failed_to_start(
    argv: list[str], log_path: Path, started: float, exc: BaseException
) -> RunResult:
    """The result for a command that never ran; the reason also goes into the log."""
    error = f"{type(exc).__name__}: {exc}"
    logger.warning("failed to start %s: %s", argv, error)
    try:
        with open(log_path, "a", encoding="utf-8") as handle:
            handle.write(f"failed to start {shlex.join(argv)}: {error}\n")
    except OSError:
        logger.exception("cannot write start error to %s", log_path)
    return RunResult(
        outcome=Outcome.FAILED_TO_START,
        exit_code=None,
        signal=None,
        wall_s=time.monotonic() - started,
        summary={},
        fail_marker=False,
        log_path=log_path,
        log_tail=tail_lines(read_log_end(log_path)),
        pgid=None,
        error=error,
    )


def _spawn(
    argv: list[str], cwd: Path, log_path: Path, env: Mapping[str, str] | None
) -> subprocess.Popen[bytes]:
    """Start the child in a new session with stdout and stderr on the (truncated) log file."""
    if not argv:
        raise ValueError("empty command")
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def run_command(
    argv: list[str],
    *,
    cwd: Path,
    log_path: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    grace_s: float = 5.0,
    poll_s: float = 0.1,
    on_start: Callable[[int, int], None] | None = None,
    on_line: Callable[[str], None] | None = None,
    stop_event: threading.Event | None = None,
) -> RunResult:
    """Run ``argv`` under a hard limit of ``timeout_s`` wall seconds and say how it ended.

    ``env`` is merged over os.environ (PYTHONUNBUFFERED=1 is set unless ``env`` overrides it).
    ``on_start(pid, pgid)`` is called right after spawn; ``on_line(line)`` for each complete log
    line as it appears. Callback errors are logged and ignored. Raises OSError only if
    ``log_path`` or its folder cannot be created.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        proc = _spawn(argv, cwd, log_path, env)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return _failed_to_start(argv, log_path, started, exc)
    pgid = proc.pid  # start_new_session makes the child its own group leader
    tailer = LogTailer(log_path, on_line)
    try:
        _call_on_start(on_start, proc.pid, pgid)
        outcome = _supervise(proc, started + timeout_s, poll_s, stop_event, tailer)
        if outcome is None:
            outcome = Outcome.EXITED
            _kill_and_reap(proc, pgid)  # stray grandchildren must not outlive the run
        else:
            logger.info("run %s: %s, killing process group %d", argv[0], outcome.value, pgid)
            _terminate(proc, pgid, grace_s, tailer)
    except BaseException:
        # We are unwinding (KeyboardInterrupt, a bug): leave no child behind.
        _kill_and_reap(proc, pgid)
        raise
    wall_s = time.monotonic() - started
    tailer.flush()
    return _finish(outcome, proc.returncode, wall_s, log_path, pgid)
