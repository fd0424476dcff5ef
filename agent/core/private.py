"""Create the service's own folders and files readable by its user only (0700 / 0600).

Stdlib only. Guaranteed: a folder created here is 0700 and a file touched here is 0600. A
folder that already exists is left as it is (it may be the user's own, such as a project
folder given with --db); a warning names it when others can read it.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

logger = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Make ``path`` (and missing parents) 0700 if it does not exist yet; return it."""
    if not path.exists():
        path.mkdir(parents=True, mode=DIR_MODE, exist_ok=True)
        os.chmod(path, DIR_MODE)
    elif stat.S_IMODE(path.stat().st_mode) & 0o077:
        logger.warning("%s can be read by other users; the database, token and logs in it "
                       "are 0600, but `chmod 700 %s` keeps even their names private", path, path)
    return path


def private_file(path: Path) -> Path:
    """Create ``path`` empty if missing, and make it 0600 (its folder via private_dir)."""
    private_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    os.close(fd)
    os.chmod(path, FILE_MODE)
    return path
