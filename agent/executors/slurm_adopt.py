"""What a dead service left in Slurm: its job folders, and a retry taking over one of them.

Used by agent.executors.slurm. A job folder (work dir/slurm/<token>, agent.executors.slurm_job)
outlives a kill -9 of the service, and so does the worktree its job runs in (restart recovery
keeps the worktrees these folders name). A retry that adopts the job runs nothing itself: when
the job ends, `take_over` makes the retry's own worktree what the job left behind (watched files
the run changed, so the tamper check sees them; the checkpoint folder, so a crashed evaluation
can still be salvaged), and the old worktree goes. A job nobody adopts is cancelled (`discard`).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.core.errors import ConfigError
from agent.executors import slurm_cli
from agent.executors.slurm_job import JobFiles, JobRequest
from agent.git.filehash import hash_paths

logger = logging.getLogger(__name__)


@dataclass
class Orphan:
    """A job a dead service left: its folder, its request and its Slurm job id."""

    files: JobFiles
    request: JobRequest
    job_id: str


def job_folders(work_dir: Path) -> list[JobFiles]:
    """Every job folder with a request under the work dir (a previous life's jobs). Only at a
    start, before anything runs: the rest of a folder whose removal a shared filesystem held
    up (a file the job still had open) goes now."""
    root = work_dir / "slurm"
    if not root.is_dir():
        return []
    folders = []
    for d in sorted(root.iterdir()):
        if (d / "request.json").is_file():
            folders.append(JobFiles(d))
        elif d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
    return folders


def left_worktrees(work_dir: Path) -> list[Path]:
    """The worktrees the jobs of a previous life run in (restart recovery keeps them)."""
    kept = []
    for files in job_folders(work_dir):
        try:
            kept.append(Path(files.read_request().worktree))
        except (OSError, ValueError, TypeError):
            continue
    return kept


def discard(files: JobFiles, job_id: str | None) -> None:
    """Cancel a left job (if it is still in Slurm) and remove its folder and worktree."""
    if job_id is not None and files.read_result() is None:
        try:
            slurm_cli.cancel([job_id])
        except ConfigError as exc:  # no Slurm on this machine any more
            logger.warning("cannot cancel Slurm job %s: %s", job_id, exc)
    try:
        request = files.read_request()
    except (OSError, ValueError, TypeError):
        request = None
    if request is not None:
        remove_worktree(Path(request.worktree), Path(request.target))
    shutil.rmtree(files.root, ignore_errors=True)


def remove_worktree(wt: Path, target: Path) -> None:
    """Delete a worktree the service no longer uses and drop git's entry for it."""
    if not wt.name or not wt.exists():
        return
    shutil.rmtree(wt, ignore_errors=True)
    subprocess.run(["git", "-C", str(target), "worktree", "prune"], capture_output=True,
                   check=False, timeout=60)


def take_over(left: JobRequest, mine: JobRequest, watched: Sequence[str]) -> list[str]:
    """Make the adopting run's worktree what the adopted job left in its own: the watched
    files it changed, and the folders the run was handed through its environment (the
    checkpoint folder). Returns the watched paths copied."""
    old, new = Path(left.worktree), Path(mine.worktree)
    if old == new or not old.is_dir():
        return []
    before, after = hash_paths(new, list(watched)), hash_paths(old, list(watched))
    changed = sorted(p for p in watched if before.get(p) != after.get(p))
    for rel in changed:
        source, dest = old / rel, new / rel
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        elif dest.exists() or dest.is_symlink():
            dest.unlink()
        if source.is_dir() and not source.is_symlink():
            shutil.copytree(source, dest, symlinks=True)
        elif source.exists() or source.is_symlink():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest, follow_symlinks=False)
    for name, value in left.env.items():
        folder, target = Path(value), Path(mine.env.get(name, ""))
        if value.startswith(str(old) + "/") and folder.is_dir() and \
                str(target).startswith(str(new) + "/"):
            shutil.rmtree(target, ignore_errors=True)
            target.parent.mkdir(parents=True, exist_ok=True)
            folder.rename(target)
    if changed:
        logger.warning("the adopted job changed %s", ", ".join(changed))
    return changed
