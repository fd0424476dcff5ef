"""Signal and inspect whole process groups by id (POSIX; zombie detection needs Linux /proc).

Stdlib only. Guaranteed: a group whose members are all zombies counts as dead; pgid <= 1 and
the caller's own group are never killed. Not guaranteed: that a pgid recorded earlier still
names the same group (ids are reused once every member has been reaped).
"""

from __future__ import annotations

import logging
import os
import signal
import time

logger = logging.getLogger(__name__)

GROUP_POLL_S = 0.02
# SIGKILL is delivered asynchronously; how long to wait for the group to actually be gone.
KILL_WAIT_S = 5.0


def _live_group_members(pgid: int) -> int | None:
    """How many non-zombie processes are in group ``pgid``, from /proc; None without /proc."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    count = 0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read().decode("ascii", errors="replace")
        except OSError:
            continue  # it exited while we looked
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat.rpartition(")")[2].split()
        if len(fields) >= 3 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            count += 1
    return count


def process_group_alive(pgid: int) -> bool:
    """True if process group ``pgid`` has a member that is not a zombie."""
    if pgid <= 0:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists but belongs to someone else
    live = _live_group_members(pgid)
    return True if live is None else live > 0


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the group; False if it no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError as exc:
        logger.warning("cannot signal process group %d: %s", pgid, exc)
    return True


def kill_process_group(pgid: int, grace_s: float = 5.0) -> bool:
    """SIGTERM the group, wait up to ``grace_s`` for it to go, then SIGKILL it and wait for that.

    Meant for orphaned runs found at service start. Refuses (returns False) for pgid <= 1 and
    for the caller's own group. Returns True if the group existed (had a non-zombie member).
    """
    if pgid <= 1 or pgid == os.getpgrp():
        logger.warning("refusing to kill process group %d", pgid)
        return False
    if not process_group_alive(pgid) or not signal_group(pgid, signal.SIGTERM):
        return False
    logger.info("sent SIGTERM to process group %d", pgid)
    if not wait_group_gone(pgid, grace_s):
        signal_group(pgid, signal.SIGKILL)
        wait_group_gone(pgid, KILL_WAIT_S)
    return True


def wait_group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` until the group has no live member; True if it is gone."""
    deadline = time.monotonic() + timeout_s
    while process_group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(GROUP_POLL_S)
    return True
