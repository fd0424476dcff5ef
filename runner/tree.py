"""Kill a run's whole process tree: its descendants, its group and everything carrying its id.

Stdlib only (the /proc walking lives in runner.reaper, which must stay importable on its own).
Guaranteed on Linux: after kill_run_tree returns True, no live process is below ``root``, in
group ``pgid`` or carries ``RUN_ID_ENV=run_id`` in its environment. Not guaranteed: processes
of another user, or ones that cleared their environment after leaving the tree while no
subreaper held them (the runner's reaper holds them while the run lives).
"""

from __future__ import annotations

import logging
import os
import signal
import time

from runner.groups import GROUP_POLL_S, KILL_WAIT_S, process_group_alive, signal_group
from runner.reaper import descendants, kill_pids, pids_with_env

logger = logging.getLogger(__name__)

RUN_ID_ENV = "OVERNIGHT_RUN_ID"


def run_members(root: int | None, pgid: int | None, run_id: str | None) -> set[int]:
    """Live processes of a run: below ``root``, plus those carrying its run id."""
    found: set[int] = set()
    if root is not None:
        found |= descendants(root)
    if run_id:
        found |= pids_with_env(RUN_ID_ENV, run_id)
    found.discard(os.getpid())
    return found


def kill_run_tree(root: int | None, pgid: int | None, run_id: str | None,
                  wait_s: float = KILL_WAIT_S) -> bool:
    """SIGKILL the run's group and every member found, repeating until none is left.

    Returns True when nothing of the run is alive any more (within ``wait_s``).
    """
    own_group = os.getpgrp()
    deadline = time.monotonic() + wait_s
    while True:
        members = run_members(root, pgid, run_id)
        group_alive = pgid is not None and pgid > 1 and pgid != own_group and (
            process_group_alive(pgid))
        if not members and not group_alive:
            return True
        if group_alive and pgid is not None:
            signal_group(pgid, signal.SIGKILL)
        kill_pids(members)
        if time.monotonic() >= deadline:
            logger.error("run %s: %d process(es) still alive after SIGKILL", run_id or pgid,
                         len(members))
            return False
        time.sleep(GROUP_POLL_S)


def kill_by_run_id(run_id: str, *, prefix: bool = False, wait_s: float = KILL_WAIT_S) -> list[int]:
    """SIGKILL every process whose environment carries the run id (or one starting with it).

    For recovery after a crash of the service: such processes may have moved anywhere.
    Returns the pids found.
    """
    found = sorted(pids_with_env(RUN_ID_ENV, run_id, prefix=prefix))
    deadline = time.monotonic() + wait_s
    left = set(found)
    while left and time.monotonic() < deadline:
        kill_pids(left)
        time.sleep(GROUP_POLL_S)
        left = pids_with_env(RUN_ID_ENV, run_id, prefix=prefix)
    return found
