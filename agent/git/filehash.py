"""Content hashes of files and folders, the same whether read from git or from disk.

A file hashes to its git blob id. A folder hashes to the sha1 of its sorted
`relative-path NUL blob-id` lines, so a protected data folder committed in git and the same folder
checked out in a worktree (or an asset outside git) give one value. `__pycache__` folders are
skipped on both sides: importing a protected module must not count as modifying it.
Stdlib only.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

MISSING = "missing"
SKIPPED_DIRS = frozenset({"__pycache__"})
_CHUNK = 1 << 20


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def file_blob_id(path: Path) -> str:
    """git's blob id of a file (of the link text for a symlink), read in chunks."""
    if path.is_symlink():
        return blob_id(os.fsencode(os.readlink(path)))
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def folder_digest(entries: Iterable[tuple[str, str]]) -> str:
    """The digest of a folder from (path relative to the folder, blob id) pairs."""
    h = hashlib.sha1(b"overnight-folder\n")
    for rel, blob in sorted(entries):
        if SKIPPED_DIRS.isdisjoint(rel.split("/")[:-1]):
            h.update(f"{rel}\0{blob}\n".encode())
    return h.hexdigest()


def _walk(folder: Path) -> Iterable[tuple[str, str]]:
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS]
        base = Path(dirpath)
        # A symlink to a folder is listed in dirnames but not followed: git stores it as a blob.
        links = [d for d in dirnames if (base / d).is_symlink()]
        for name in [*filenames, *links]:
            rel = (base / name).relative_to(folder).as_posix()
            yield rel, file_blob_id(base / name)


def hash_path(path: Path) -> str:
    """A file's blob id, a folder's digest, or MISSING. A symlinked root (an asset) is followed."""
    if path.is_dir():
        return folder_digest(_walk(path.resolve()))
    if path.is_file():
        return file_blob_id(path.resolve())
    return MISSING


def hash_paths(root: Path, paths: Sequence[str]) -> dict[str, str]:
    """hash_path of each path under `root` (an absolute path is taken as it is)."""
    return {p: hash_path(root / p) for p in paths}
