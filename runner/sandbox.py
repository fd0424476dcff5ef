"""Wrap a command in a bubblewrap (`bwrap`) sandbox: read-only root, one writable folder.

Stdlib only. Guaranteed (when bwrap starts): the command sees the host's files read-only, its
worktree (and ``also_writable``) writable, a private empty /tmp, the ``hidden_dirs`` as empty
folders and the ``hidden_files`` as empty files, its own pid namespace (everything in it dies
with the sandbox) and, unless ``network`` is set, no network but a loopback. Not guaranteed:
anything about devices (/dev is the host's, so GPUs work) or about what the host's files reveal.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

BWRAP = "bwrap"


def bwrap_path() -> str | None:
    """The bwrap executable, or None when it is not installed."""
    return shutil.which(BWRAP)


def interpreter_dirs(argv: list[str]) -> list[Path]:
    """Folders under /tmp the command needs to start: the service's interpreter (its venv) and
    the command's own executable. The private /tmp would hide them otherwise."""
    tmp = Path("/tmp")
    found = []
    for folder in (Path(sys.prefix), Path(argv[0]).parent if argv else None):
        if folder is not None and folder.is_absolute() and folder.is_dir() \
                and tmp in folder.parents and folder not in found:
            found.append(folder)
    return found


def bwrap_command(
    argv: list[str], *, writable: Path, hidden_dirs: Iterable[Path] = (),
    hidden_files: Iterable[Path] = (), also_writable: Iterable[Path] = (), network: bool = False,
) -> list[str]:
    """``argv`` run inside bwrap with ``writable`` as its working folder.

    Where bwrap is not installed the command names plain "bwrap", so it fails to start with a
    clear "command not found" rather than running unsandboxed.
    """
    wrapped = [bwrap_path() or BWRAP, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev",
               "--proc", "/proc", "--tmpfs", "/tmp"]
    for folder in interpreter_dirs(argv):  # a venv under /tmp must outlive the private /tmp
        wrapped += ["--ro-bind", str(folder), str(folder)]
    for folder in hidden_dirs:
        wrapped += ["--tmpfs", str(folder)]
    for file in hidden_files:
        if file.exists():
            wrapped += ["--ro-bind", "/dev/null", str(file)]
    for folder in also_writable:  # e.g. the sweep's compile cache, inside a hidden folder
        wrapped += ["--bind", str(folder), str(folder)]
    wrapped += ["--bind", str(writable), str(writable), "--chdir", str(writable),
                "--setenv", "TMPDIR", "/tmp", "--unshare-pid", "--unshare-ipc",
                "--die-with-parent"]
    if not network:
        wrapped.append("--unshare-net")
    return [*wrapped, "--", *argv]
