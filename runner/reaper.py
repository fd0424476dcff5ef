"""A tiny supervisor that runs one command as a child subreaper and leaves nothing behind.

Run as a script (`python -I -S runner/reaper.py [--deadline-s S --grace-s G] -- ARGV...`), so it
imports only the standard
library and never the runner package (a worktree's sitecustomize.py cannot load into it). It
makes itself a child subreaper (Linux `prctl(PR_SET_CHILD_SUBREAPER)`; elsewhere it degrades to
a plain waiting parent), starts ARGV, reaps every orphan that lands on it, and when ARGV ends
kills every remaining descendant (setsid and double-fork escapes included: while the reaper
lives they are all below it), then exits the way ARGV did (same code, or the same signal).
SIGTERM to the group reaches ARGV and is ignored here, so ARGV decides how to end.

With `--deadline-s S` the reaper also keeps the run's hard limit itself: S seconds after the start
it SIGTERMs its group, gives ARGV `--grace-s` seconds, kills every descendant and exits
DEADLINE_EXIT. The service keeps the deadline on a watchdog thread and passes this one past the
watchdog's whole schedule, so it acts only when the service cannot (frozen by SIGSTOP, starved,
or gone): the reaper is a process of its own.

The /proc helpers (descendants, pids_with_env) are also used by the runner in the service.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
DEADLINE_EXIT = 124  # like timeout(1): the reaper ended the run at its hard limit
DEADLINE_NOTE = "overnight: the run's supervisor killed it at its hard time limit"
KILL_ROUNDS = 50
ROUND_WAIT_S = 0.02


def make_subreaper() -> bool:
    """Become a child subreaper; False where the OS has no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _stat_fields(pid: str) -> list[str] | None:
    """The fields after "(comm)" in /proc/<pid>/stat: state, ppid, pgrp, session, ..."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read().decode("ascii", errors="replace")
    except OSError:
        return None
    return stat.rpartition(")")[2].split()


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, state) for every process in /proc; {} without /proc."""
    table: dict[int, tuple[int, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if entry.isdigit():
            fields = _stat_fields(entry)
            if fields is not None and len(fields) >= 2:
                table[int(entry)] = (int(fields[1]), fields[0])
    return table


def descendants(root: int, table: dict[int, tuple[int, str]] | None = None) -> set[int]:
    """Every live (non-zombie) process below ``root`` in the parent tree."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in found or pid == root:
            continue
        found.add(pid)
        todo.extend(children.get(pid, []))
    return {pid for pid in found if table[pid][1] not in ("Z", "X")}


def pids_with_env(name: str, value: str, *, prefix: bool = False) -> set[int]:
    """Live processes whose environment (as /proc/<pid>/environ shows it) holds name=value.

    With ``prefix``, any value starting with ``value`` matches. Never the caller itself.
    """
    want = f"{name}={value}".encode()
    found: set[int] = set()
    for pid, (_, state) in process_table().items():
        if pid == os.getpid() or state in ("Z", "X"):
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                entries = handle.read().split(b"\0")
        except OSError:
            continue
        for entry in entries:
            if entry == want or (prefix and entry.startswith(want)):
                found.add(pid)
                break
    return found


def kill_pids(pids: set[int]) -> None:
    """SIGKILL each pid; ones already gone are fine. Never ourselves or init."""
    for pid in pids:
        if pid > 1 and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _reap_any() -> list[tuple[int, int]]:
    """Reap every child that has ended; (pid, status) pairs."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def clear_descendants() -> None:
    """Kill and reap everything below us, repeating while new processes keep appearing."""
    for _ in range(KILL_ROUNDS):
        left = descendants(os.getpid())
        _reap_any()
        if not left:
            return
        kill_pids(left)
        time.sleep(ROUND_WAIT_S)


def _exit_like(status: int) -> None:
    """Exit with the child's code, or die of the child's signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file of ours
        except (ImportError, ValueError, OSError):
            pass
        os.kill(os.getpid(), sig)
    sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


class _Deadline(Exception):
    """Raised in the main thread by SIGALRM: the run's hard limit has come."""


def _on_alarm(_signum: int, _frame: object) -> None:
    raise _Deadline


def _options(argv: list[str]) -> tuple[float | None, float, list[str]]:
    """(--deadline-s, --grace-s, ARGV) from `[--deadline-s S] [--grace-s G] -- ARGV`."""
    deadline, grace = None, 5.0
    while argv and argv[0] in ("--deadline-s", "--grace-s") and len(argv) > 1:
        value = float(argv[1])
        if argv[0] == "--deadline-s":
            deadline = value
        else:
            grace = value
        argv = argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    return deadline, grace, argv


def _wait_for(child: int) -> int:
    while True:
        pid, wait_status = os.waitpid(-1, 0)
        if pid == child:
            return wait_status


def _end_at_deadline(child: int, grace_s: float) -> None:
    """SIGTERM the group (not us: we ignore it), wait out the grace, then kill everything."""
    os.write(2, f"\n{DEADLINE_NOTE}\n".encode())
    try:
        os.killpg(os.getpgrp(), signal.SIGTERM)
    except OSError:
        pass
    until = time.monotonic() + grace_s
    while time.monotonic() < until:
        try:
            pid, _ = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == child:
            break
        time.sleep(ROUND_WAIT_S)
    kill_pids({child})
    clear_descendants()


def main(argv: list[str]) -> None:
    deadline_s, grace_s, argv = _options(argv)
    if not argv:
        sys.exit("reaper: no command given")
    make_subreaper()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = os.fork()
    except OSError as exc:
        sys.exit(f"reaper: cannot fork: {exc}")
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"failed to start {argv[0]}: {type(exc).__name__}: {exc}\n".encode())
            os._exit(127)
    if deadline_s is not None:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, max(deadline_s, 0.001))
    try:
        status = _wait_for(child)
    except _Deadline:
        _end_at_deadline(child, grace_s)
        sys.exit(DEADLINE_EXIT)
    signal.setitimer(signal.ITIMER_REAL, 0)
    clear_descendants()
    _exit_like(status)


if __name__ == "__main__":
    main(sys.argv[1:])
