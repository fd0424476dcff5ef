"""Git adapter (gitpython): commits proposals without touching any checkout, runs worktrees.

Commits are built in a throw-away index (GIT_INDEX_FILE, a copy of the base commit's index,
cached per commit) so the user's checkout, index and branches are never touched; only
`overnight/<sweep>` and `refs/overnight/...` refs move. Every git call runs with hooks disabled
(core.hooksPath=/dev/null), so a hook planted in the target (by a run, say) never runs as the
service. Admission costs one git process per proposal: `apply --cached` on the cached index,
whose result is read in-process (agent.git.files), as is the sweep branch's commit.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import git

from agent.core.diff import PathChange, parse_diff_tree
from agent.core.errors import PatchError, is_out_of_space
from agent.git.filehash import MISSING, folder_digest, hash_paths
from agent.git.files import IndexEntries, branch_commit, index_changes, is_object_id, read_index

logger = logging.getLogger(__name__)

# Commits made by the service carry a fixed identity so they work on machines with no git config.
IDENTITY = {
    "GIT_AUTHOR_NAME": "overnight",
    "GIT_AUTHOR_EMAIL": "overnight@localhost",
    "GIT_COMMITTER_NAME": "overnight",
    "GIT_COMMITTER_EMAIL": "overnight@localhost",
}
# Config given through the environment (git >= 2.31) reaches every git command, subcommands
# included, and outranks the repository's own config.
NO_HOOKS = {
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "core.hooksPath",
    "GIT_CONFIG_VALUE_0": os.devnull,
}
GIT_ENV = {**IDENTITY, **NO_HOOKS}
INDEX_CACHE_SIZE = 8  # base commits whose index is kept: a few sweep heads per target
# Scratch indexes are written and deleted once per proposal: in memory (tmpfs) where there is
# one, since on a journalling disk the delete alone cost more than the git process's start.
SCRATCH_DIR = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None


class GitError(RuntimeError):
    """A git command failed; the message is git's own stderr."""


# git's `worktree add/remove/prune` are not safe at once on one repository (one reads
# .git/worktrees/* while another is half-way writing it): slots of one process take turns.
_WORKTREE_LOCKS: dict[str, threading.Lock] = {}
_WORKTREE_LOCKS_GUARD = threading.Lock()


def _worktree_lock(path: Path) -> threading.Lock:
    with _WORKTREE_LOCKS_GUARD:
        return _WORKTREE_LOCKS.setdefault(str(path.resolve()), threading.Lock())


class GitRepo:
    def __init__(self, path: Path | str) -> None:
        try:
            self._repo = git.Repo(path)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise GitError(f"{path}: not a git repository") from None
        self.path = Path(self._repo.working_tree_dir or path)
        self._git_dir, self._common_dir = Path(self._repo.git_dir), Path(self._repo.common_dir)
        self._indexes: OrderedDict[str, tuple[bytes, IndexEntries | None]] = OrderedDict()
        self._index_lock = threading.Lock()

    def _git(self, *args: str, env: dict[str, str] | None = None) -> str:
        if not self.path.is_dir():
            raise GitError(f"{self.path}: the target directory is gone (moved or deleted)")
        try:
            out = self._repo.git.execute(["git", *args], env={**GIT_ENV, **(env or {})})
            return str(out).strip()
        except git.GitCommandError as exc:
            raise GitError(
                f"git {args[0]}: {(exc.stderr or exc.stdout or str(exc)).strip()}"
            ) from None

    def remove_stale_ref_locks(self, prefixes: Sequence[str]) -> list[Path]:
        """Delete `<ref>.lock` files under these ref folders (left by a kill mid-update)."""
        git_dir = Path(self._git("rev-parse", "--absolute-git-dir"))
        removed = []
        for sub in prefixes:
            base = git_dir / sub
            if base.is_dir():
                for lock in base.rglob("*.lock"):
                    lock.unlink(missing_ok=True)
                    removed.append(lock)
        return removed

    def head(self, ref: str) -> str:
        """The commit `ref` names. A branch is read from git's ref files in-process (no
        process per call); anything else, or anything unusual, is asked of `rev-parse`."""
        return (branch_commit(self._git_dir, self._common_dir, ref)
                or self._git("rev-parse", "--verify", f"{ref}^{{commit}}"))

    def has_ref(self, ref: str) -> bool:
        try:
            self.head(ref)
            return True
        except GitError:
            return False

    def ensure_branch(self, branch: str, start: str = "HEAD") -> str:
        ref = f"refs/heads/{branch}"
        if not self.has_ref(ref):
            self._git("update-ref", ref, self.head(start), "")
        return self.head(ref)

    # --- applying a diff in a scratch index ------------------------------------------------
    def _base_index(self, base: str) -> tuple[bytes, IndexEntries | None]:
        """The index of `base`'s tree (bytes, and its entries when readable in-process).

        Cached per commit (immutable), so the POSTs against one sweep head share one
        read-tree; the lock is this repository's own and held only to build a missing one.
        """
        cacheable = is_object_id(base)
        with self._index_lock:
            hit = self._indexes.get(base) if cacheable else None
            if hit is not None:
                self._indexes.move_to_end(base)
                return hit
            index = self._scratch_path()
            try:
                self._git("read-tree", base, env={"GIT_INDEX_FILE": index,
                                                  "GIT_INDEX_VERSION": "2"})
                data = Path(index).read_bytes()
            finally:
                _unlink(index)
            hit = (data, read_index(data, len(base) // 2) if cacheable else None)
            if cacheable:
                self._indexes[base] = hit
                while len(self._indexes) > INDEX_CACHE_SIZE:
                    self._indexes.popitem(last=False)
            return hit

    @staticmethod
    def _scratch_path() -> str:
        fd, index = tempfile.mkstemp(prefix="overnight-index-", dir=SCRATCH_DIR)
        os.close(fd)
        os.unlink(index)  # git writes it (through index.lock) itself
        return index

    @contextmanager
    def _scratch_index(self, base: str) -> Iterator[str]:
        """A throw-away index file holding `base`'s tree (deleted afterwards)."""
        data, _ = self._base_index(base)
        fd, index = tempfile.mkstemp(prefix="overnight-index-", dir=SCRATCH_DIR)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            yield index
        finally:
            _unlink(index)

    def _apply_cached(self, index: str, diff: str, *, check_only: bool) -> None:
        """`git apply --cached` of `diff` onto the scratch `index`; GitError with git's words."""
        env = {"GIT_INDEX_FILE": index}
        patch = diff if diff.endswith("\n") else diff + "\n"
        args = ["apply", "--cached", "--recount", "--whitespace=nowarn"]
        args += ["--check"] if check_only else []
        try:
            self._apply(args, patch, env)
        except GitError as exc:
            # Hunks written without context lines (common from language models) only
            # apply with --unidiff-zero; git's first message is the one worth showing.
            first = exc
            try:
                self._apply(args + ["--unidiff-zero"], patch, env)
            except GitError:
                raise first from None

    def _apply(self, args: list[str], patch: str, env: dict[str, str]) -> None:
        # gitpython cannot feed stdin text portably; a plain subprocess keeps git's message.
        proc = subprocess.run(
            ["git", *args, "-"],
            input=patch,
            text=True,
            capture_output=True,
            cwd=self.path,
            env={**os.environ, **GIT_ENV, **env},
        )
        if proc.returncode != 0:
            raise GitError((proc.stderr or proc.stdout).strip() or "git apply failed")

    def check_applies(self, base: str, diff: str) -> str | None:
        try:
            with self._scratch_index(base) as index:
                self._apply_cached(index, diff, check_only=True)
        except GitError as exc:
            if is_out_of_space(exc):
                raise  # git could not write its objects: no answer about the diff
            return str(exc)
        return None

    @contextmanager
    def _applied(self, base: str, diff: str) -> Iterator[tuple[str, list[PathChange] | None]]:
        """A scratch index of `base`'s tree with `diff` applied, and what that changes when both
        indexes read in-process (agent.git.files; None for an unusual index: ask git). Raises
        PatchError (git's message) when the diff does not apply."""
        _, before = self._base_index(base)
        with self._scratch_index(base) as index:
            try:
                self._apply_cached(index, diff, check_only=False)
            except GitError as exc:
                if is_out_of_space(exc):
                    raise  # the disk, not the diff
                raise PatchError(str(exc)) from None
            after = (read_index(Path(index).read_bytes(), len(base) // 2) if before is not None
                     else None)
            yield index, (index_changes(before, after)
                          if before is not None and after is not None else None)

    def tree_changes(self, base: str, diff: str) -> list[PathChange]:
        """What applying ``diff`` on ``base`` changes, in git's own words. Raises PatchError
        (git's message) when it does not apply.

        One git process: the applied scratch index is compared with `base`'s in-process,
        falling back to write-tree + diff-tree for an unusual index."""
        with self._applied(base, diff) as (index, changes):
            if changes is not None:
                return changes
            tree = self._git("write-tree", env={"GIT_INDEX_FILE": index})
        return self._diff_tree(base, tree)

    def _diff_tree(self, old: str, new: str) -> list[PathChange]:
        proc = subprocess.run(
            ["git", "diff-tree", "-r", "--no-renames", "--no-commit-id", "-z", old, new],
            capture_output=True, cwd=self.path, env={**os.environ, **GIT_ENV},
        )
        if proc.returncode != 0:
            raise GitError(f"git diff-tree: {proc.stderr.decode(errors='replace').strip()}")
        return parse_diff_tree(proc.stdout)

    def commit_proposal(self, base: str, diff: str, message: str) -> tuple[str, list[PathChange]]:
        """Commit `diff` on `base` without touching any worktree: (the commit, what it changes
        against `base` in git's own words). Raises PatchError (git's message) when the diff does
        not apply.

        Three git processes (apply, write-tree, commit-tree): the changes are read from the
        applied scratch index in-process as tree_changes does, not asked of diff-tree."""
        with self._applied(base, diff) as (index, changes):
            tree = self._git("write-tree", env={"GIT_INDEX_FILE": index})
        commit = self._git("commit-tree", tree, "-p", base, "-m", message)
        return commit, changes if changes is not None else self._diff_tree(base, tree)

    def set_ref(self, ref: str, sha: str) -> None:
        self._git("update-ref", ref, sha)

    def advance_branch(self, branch: str, sha: str, expected_old: str) -> None:
        self._git("update-ref", "-m", "overnight: keep", f"refs/heads/{branch}", sha, expected_old)

    def add_worktree(self, path: Path, sha: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _worktree_lock(self.path):
            self._git("worktree", "add", "--detach", "--force", str(path), sha)

    def remove_worktree(self, path: Path) -> None:
        with _worktree_lock(self.path):
            try:
                self._git("worktree", "remove", "--force", str(path))
            except GitError as exc:
                logger.warning("worktree remove failed (%s); deleting the folder", exc)
                shutil.rmtree(path, ignore_errors=True)
                self._git("worktree", "prune")

    def prune_worktrees(self, ours: Path | None = None) -> None:
        """`git worktree prune`. With `ours`, first unlock the entries of worktrees that lay
        below it and are gone: a kill during `git worktree add` leaves the entry locked
        ("initializing"), which prune keeps for ever, and its commit reachable."""
        with _worktree_lock(self.path):
            if ours is not None:
                self._unlock_gone(ours.expanduser().resolve())
            self._git("worktree", "prune")

    def _unlock_gone(self, ours: Path) -> None:
        common = Path(self._git("rev-parse", "--git-common-dir"))
        admin = (common if common.is_absolute() else self.path / common) / "worktrees"
        for entry in sorted(admin.glob("*")) if admin.is_dir() else []:
            lock = entry / "locked"
            try:
                checkout = Path((entry / "gitdir").read_text(encoding="utf-8").strip()).parent
            except OSError:
                continue  # killed before git wrote where it was: prune's own rules apply
            if lock.exists() and checkout.is_relative_to(ours) and not checkout.exists():
                logger.info("unlocking the half-created worktree entry %s", entry.name)
                lock.unlink(missing_ok=True)

    def read_file(self, sha: str, path: str) -> str:
        return self._git("show", f"{sha}:{path}") + "\n"

    def file_hashes(self, sha: str, paths: Sequence[str]) -> dict[str, str]:
        """Each path's hash at `sha` as agent.git.filehash computes it on disk (a folder too)."""
        out = {}
        for p in paths:
            try:
                kind = self._git("cat-file", "-t", f"{sha}:{p}")
            except GitError:
                out[p] = MISSING
                continue
            if kind == "tree":
                out[p] = folder_digest(self._tree_blobs(sha, p))
            else:
                out[p] = self._git("rev-parse", f"{sha}:{p}")
        return out

    def _tree_blobs(self, sha: str, folder: str) -> list[tuple[str, str]]:
        listing = self._git("ls-tree", "-r", "-z", "--full-tree", sha, "--", folder)
        entries = []
        for item in listing.split("\0"):
            if item:
                meta, path = item.split("\t", 1)
                entries.append((path[len(folder.rstrip("/")) + 1 :], meta.split()[2]))
        return entries

    def uncommitted(self) -> list[tuple[str, str]]:
        """(status code, path) of each change in the checkout: `git status --porcelain`."""
        proc = subprocess.run(  # not _git: its strip() would eat the first status column
            ["git", "status", "--porcelain=v1", "-z", "--untracked-files=all"],
            capture_output=True, text=True, cwd=self.path, env={**os.environ, **IDENTITY},
        )
        if proc.returncode != 0:
            raise GitError(f"git status: {proc.stderr.strip()}")
        out = proc.stdout
        items = out.split("\0")
        changes, i = [], 0
        while i < len(items):
            item = items[i]
            i += 1
            if len(item) > 3:
                changes.append((item[:2], item[3:]))
                if item[0] in "RC":  # a rename names its source next
                    i += 1
        return changes

    def log(self, branch: str, limit: int = 100) -> list[tuple[str, str]]:
        text = self._git("log", f"-n{limit}", "--format=%h%x09%s", branch)
        return [tuple(line.split("\t", 1)) for line in text.splitlines() if line]  # type: ignore[misc]

    def diff(self, old: str, new: str, context: int | None = None) -> str:
        """`git diff old new` (with `context` lines around each change: git's -U)."""
        args = ["diff", *([f"-U{context}"] if context is not None else []), old, new]
        return self._git(*args) + "\n"


def _unlink(path: str) -> None:
    for leftover in (path, path + ".lock"):
        if os.path.exists(leftover):
            os.unlink(leftover)


def hash_worktree_files(root: Path, paths: Sequence[str]) -> dict[str, str]:
    """Hashes of files and folders on disk, comparable with GitRepo.file_hashes."""
    return hash_paths(root, paths)


def init_repo(path: Path, message: str = "overnight: initial target") -> str:
    """git init a folder (if needed) and commit everything in it; return the head sha."""
    repo = git.Repo.init(path)
    env = {**os.environ, **GIT_ENV}
    repo.git.add(A=True, env=env)
    if repo.is_dirty(index=True, untracked_files=False) or not repo.head.is_valid():
        repo.git.commit("-m", message, "--allow-empty", env=env)
    return repo.head.commit.hexsha
