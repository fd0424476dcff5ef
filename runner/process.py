"""Run one command in its own process group under a hard wall-clock limit, logging to a file.

Stdlib only, POSIX only. Guaranteed: run_command never raises for a failing child (it returns a
RunResult); the deadline is kept by a watchdog thread, whatever the child prints and however slow
the line callback is, and backed by the reaper process, which ends the run by itself (TIMED_OUT) if
this process is frozen or starved past the watchdog's schedule: a run is dead within timeout + 2 ×
grace + BACKSTOP_MARGIN_S however its caller fares; the command runs below runner/reaper.py, a child
subreaper (Linux), so on return every process of the run has been sent SIGKILL - its group, every
descendant (setsid and double-fork escapes included) and every process carrying its OVERNIGHT_RUN_ID
- and the child has been reaped; the child gets an allow-listed environment (runner.environment);
the child writes its own log, so the log survives the parent dying, and on return the log is at most
``log_max_bytes`` (head and tail kept, the cut noted in it). Not guaranteed: that a recorded pgid
still names the same group later (kill_process_group trusts the caller's pgid).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from runner.environment import guest_environment
from runner.groups import GROUP_POLL_S, kill_process_group, process_group_alive, signal_group
from runner.logtail import LOG_MAX_BYTES, LogTailer, cap_log, read_log_end
from runner.reaper import DEADLINE_EXIT, DEADLINE_NOTE
from runner.result import Outcome, RunResult, last_error_line, tail_lines
from runner.summary import has_fail_marker, parse_summary
from runner.tree import RUN_ID_ENV, kill_run_tree

logger = logging.getLogger(__name__)

__all__ = ["kill_process_group", "process_group_alive", "resolve_command", "run_command"]

PYTHON_NAMES = frozenset({"python", "python3"})
REAPER = Path(__file__).with_name("reaper.py")
# A child stuck in uninterruptible sleep (say, in a GPU driver) survives SIGKILL for a while;
# past this we stop waiting for it rather than hang the caller.
REAP_TIMEOUT_S = 30.0
# The reaper's own deadline: this long after the watchdog's SIGKILL should have landed, so it
# acts only when this process was held up (frozen, starved) and never races the watchdog.
BACKSTOP_MARGIN_S = 1.0


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


class _Run:
    """One started child: its ids, and the one way to end all of it."""

    def __init__(self, proc: subprocess.Popen[bytes], run_id: str | None) -> None:
        self.proc, self.pgid, self.run_id = proc, proc.pid, run_id
        self._kill_lock = threading.Lock()

    def exited(self) -> bool:
        return _child_exited(self.proc)

    def wait_exit(self, seconds: float, tailer: LogTailer | None = None) -> bool:
        """Wait up to ``seconds`` for the child to end (following the log); True if it ended."""
        deadline = time.monotonic() + seconds
        while not self.exited():
            if time.monotonic() >= deadline:
                return False
            time.sleep(GROUP_POLL_S)
            if tailer is not None:
                tailer.poll()
        return True

    def kill_all(self) -> None:
        """SIGKILL every process of the run, then reap the child. Safe to call twice."""
        with self._kill_lock:
            kill_run_tree(self.proc.pid, self.pgid, self.run_id)
            try:
                self.proc.wait(timeout=REAP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.error("pid %d not reaped %.0fs after SIGKILL", self.proc.pid,
                             REAP_TIMEOUT_S)

    def terminate(self, grace_s: float, tailer: LogTailer | None = None) -> None:
        """SIGTERM the group, give the child ``grace_s`` to end, then kill everything."""
        signal_group(self.pgid, signal.SIGTERM)
        self.wait_exit(grace_s, tailer)
        self.kill_all()


class _Watchdog(threading.Thread):
    """Ends the run at its deadline on its own thread, so no amount of output can delay it."""

    def __init__(self, run: _Run, deadline: float, grace_s: float) -> None:
        super().__init__(name=f"watchdog-{run.pgid}", daemon=True)
        self.run_, self.deadline, self.grace_s = run, deadline, grace_s
        self.cancelled = threading.Event()
        self.fired = False

    def run(self) -> None:
        if self.cancelled.wait(max(0.0, self.deadline - time.monotonic())):
            return
        if self.run_.exited():
            return
        self.fired = True
        logger.info("run %d: timed out, killing its process tree", self.run_.pgid)
        self.run_.terminate(self.grace_s)


def _supervise(run: _Run, watchdog: _Watchdog, poll_s: float,
               stop_event: threading.Event | None, tailer: LogTailer) -> Outcome | None:
    """Follow the log until the child exits (None or TIMED_OUT) or the caller asks to stop."""
    while True:
        behind = tailer.poll()
        if run.exited():
            return Outcome.TIMED_OUT if watchdog.fired else None
        if stop_event is not None and stop_event.is_set():
            return Outcome.TIMED_OUT if watchdog.fired else Outcome.STOPPED
        if behind:
            continue  # more output waits; the watchdog keeps the deadline meanwhile
        if stop_event is not None:
            stop_event.wait(poll_s)
        else:
            time.sleep(poll_s)


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
    if outcome is Outcome.EXITED and returncode == DEADLINE_EXIT and DEADLINE_NOTE in text:
        outcome = Outcome.TIMED_OUT  # the reaper kept the limit (this process was held up)
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


def _check_executable(argv: list[str], cwd: Path, env: Mapping[str, str]) -> None:
    """Raise as exec would for a command that cannot start (the reaper would only exit 127)."""
    if not argv:
        raise ValueError("empty command")
    if not cwd.is_dir():
        raise FileNotFoundError(f"no such directory: {str(cwd)!r}")
    name = argv[0]
    if os.sep in name:
        path = cwd / name
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {name!r}")
        if not os.access(path, os.X_OK):
            raise PermissionError(f"not executable: {name!r}")
    elif shutil.which(name, path=env.get("PATH", os.defpath)) is None:
        raise FileNotFoundError(f"command not found: {name!r}")


def _spawn(argv: list[str], cwd: Path, log_path: Path, env: Mapping[str, str],
           timeout_s: float, grace_s: float) -> subprocess.Popen[bytes]:
    """Start the reaper (and so the command) in a new session, output on the log (mode 0600).
    The reaper is the deadline's backstop in a process of its own: past the watchdog's whole
    schedule (the limit, the grace, a margin) it ends the run itself."""
    _check_executable(argv, cwd, env)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as log_file:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", str(REAPER),
             "--deadline-s", repr(timeout_s + grace_s + BACKSTOP_MARGIN_S),
             "--grace-s", repr(grace_s), "--", *argv],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def _end(run: _Run, outcome: Outcome | None, grace_s: float, tailer: LogTailer) -> Outcome:
    if outcome is None:
        run.kill_all()  # stray descendants must not outlive the run
        return Outcome.EXITED
    if outcome is Outcome.STOPPED:
        logger.info("run %d: stopped, killing its process tree", run.pgid)
        run.terminate(grace_s, tailer)
    run.kill_all()
    return outcome


def run_command(
    argv: list[str],
    *,
    cwd: Path,
    log_path: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    pass_env: Iterable[str] = (),
    grace_s: float = 5.0,
    poll_s: float = 0.1,
    log_max_bytes: int = LOG_MAX_BYTES,
    on_start: Callable[[int, int], None] | None = None,
    on_line: Callable[[str], None] | None = None,
    stop_event: threading.Event | None = None,
) -> RunResult:
    """Run ``argv`` under a hard limit of ``timeout_s`` wall seconds and say how it ended.

    The child's environment is the allow-listed part of os.environ plus the names in
    ``pass_env``, PYTHONUNBUFFERED=1, then ``env`` on top; ``env[OVERNIGHT_RUN_ID]``, if given,
    marks every process of the run. ``on_start(pid, pgid)`` is called right after spawn;
    ``on_line(line)`` for log lines as they appear (far behind a flood, only the newest part
    is delivered). Callback errors are logged and ignored. Raises OSError only if
    ``log_path`` or its folder cannot be created.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    child_env = guest_environment(os.environ, {"PYTHONUNBUFFERED": "1", **(env or {})}, pass_env)
    try:
        proc = _spawn(argv, cwd, log_path, child_env, timeout_s, grace_s)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return _failed_to_start(argv, log_path, started, exc)
    run = _Run(proc, child_env.get(RUN_ID_ENV))
    watchdog = _Watchdog(run, started + timeout_s, grace_s)
    watchdog.start()
    tailer = LogTailer(log_path, on_line)
    try:
        _call_on_start(on_start, proc.pid, run.pgid)
        outcome = _end(run, _supervise(run, watchdog, poll_s, stop_event, tailer), grace_s,
                       tailer)
    except BaseException:
        run.kill_all()  # we are unwinding (KeyboardInterrupt, a bug): leave nothing behind
        raise
    finally:
        watchdog.cancelled.set()
    wall_s = time.monotonic() - started
    tailer.flush()
    cap_log(log_path, log_max_bytes)
    return _finish(outcome, proc.returncode, wall_s, log_path, run.pgid)
