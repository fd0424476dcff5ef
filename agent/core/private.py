"""Create the service's own folders and files readable by its user only (0700 / 0600).

Stdlib only. Guaranteed: a folder created here is 0700 and a file touched here is 0600, and
inside `owner_only()` everything the process (and every child it starts) creates is its
user's only. A folder that already exists is left as it is (it may be the user's own, such as
a project folder given with --db); one warning per process names it when it is open to others.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
PRIVATE_UMASK = 0o077  # no bit for the group or others on anything created

_warned: set[Path] = set()  # folders already named in a warning (once per process)
_warned_lock = threading.Lock()


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) 0700 if it does not exist yet; return it."""
    if not path.exists():
        path.mkdir(parents=True, mode=DIR_MODE, exist_ok=True)
        os.chmod(path, DIR_MODE)
    elif stat.S_IMODE(path.stat().st_mode) & 0o077:
        _warn_open_folder(path)
    return path


def _warn_open_folder(path: Path) -> None:
    key = path.resolve()
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    mode = stat.S_IMODE(path.stat().st_mode)
    logger.warning("%s (mode %04o) is open to other users: the database, token and logs in it "
                   "are 0600, but their names show; `chmod 700 %s` keeps even the names "
                   "private", path, mode, path)


def private_file(path: Path) -> Path:
    """Create ``path`` empty if missing, and make it 0600 (its folder via private_dir)."""
    private_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    os.close(fd)
    os.chmod(path, FILE_MODE)
    return path


@contextlib.contextmanager
def owner_only() -> Iterator[None]:
    """While inside, files and folders this process or its children create get no bit for
    the group or others (umask 077 added to the current one); the umask is restored after."""
    before = os.umask(PRIVATE_UMASK)
    os.umask(before | PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(before)
