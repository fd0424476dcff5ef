"""The admission fast path reads git's own files in-process (agent.git.files): on real git
repositories its answers equal git's (`rev-parse`, `write-tree` + `diff-tree`), and anything
it does not understand is handed to git instead of guessed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import make_target
from hostile_diffs import README, all_cases, committed_changes, good_hunk

from agent.core.errors import PatchError
from agent.git.files import branch_commit, read_index
from agent.git.repo import GitRepo


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def _rev_parse(repo: Path, ref: str) -> str:
    return _git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}")


@pytest.fixture
def hostile_target(tmp_path: Path) -> Path:
    return make_target(tmp_path / "target", edits={"README.md": README, "empty.txt": ""})


def _git_dirs(repo: Path) -> tuple[Path, Path]:
    git_dir = Path(_git(repo, "rev-parse", "--absolute-git-dir"))
    common = Path(_git(repo, "rev-parse", "--git-common-dir"))
    return git_dir, common if common.is_absolute() else (repo / common).resolve()


def test_a_branch_is_read_from_loose_and_packed_refs_as_git_reads_it(target: Path) -> None:
    head = _rev_parse(target, "HEAD")
    _git(target, "update-ref", "refs/heads/overnight/a", head)
    git_dir, common = _git_dirs(target)
    assert (common / "refs/heads/overnight/a").is_file()  # loose
    assert branch_commit(git_dir, common, "overnight/a") == head
    assert branch_commit(git_dir, common, "refs/heads/overnight/a") == head
    _git(target, "pack-refs", "--all")
    assert not (common / "refs/heads/overnight/a").exists()  # packed now
    assert branch_commit(git_dir, common, "overnight/a") == head
    assert branch_commit(git_dir, common, "overnight/missing") is None
    assert GitRepo(target).head("overnight/a") == _rev_parse(target, "overnight/a")


def test_what_rev_parse_finds_first_is_left_to_git(target: Path) -> None:
    """A tag named like the branch wins in `rev-parse`: the reader steps aside (None) and
    GitRepo.head still answers what git answers."""
    first = _rev_parse(target, "HEAD")
    (target / "train.py").write_text((target / "train.py").read_text() + "# two\n")
    _git(target, "commit", "-qam", "two", "--author", "t <t@t>")
    second = _rev_parse(target, "HEAD")
    _git(target, "update-ref", "refs/heads/twin", second)
    _git(target, "tag", "twin", first)
    git_dir, common = _git_dirs(target)
    assert branch_commit(git_dir, common, "twin") is None
    assert branch_commit(git_dir, common, "refs/heads/twin") == second
    assert GitRepo(target).head("twin") == _rev_parse(target, "twin") == first
    assert branch_commit(git_dir, common, "HEAD") is None  # symbolic: git's to answer
    assert branch_commit(git_dir, common, "twin~1") is None


def test_a_linked_worktree_reads_the_shared_refs(target: Path, tmp_path: Path) -> None:
    head = _rev_parse(target, "HEAD")
    _git(target, "update-ref", "refs/heads/overnight/w", head)
    _git(target, "worktree", "add", "--detach", str(tmp_path / "linked"), head)
    git_dir, common = _git_dirs(tmp_path / "linked")
    assert git_dir != common
    assert branch_commit(git_dir, common, "overnight/w") == head


def _slow_changes(repo: GitRepo, base: str, diff: str) -> list:  # type: ignore[type-arg]
    """git's own answer: apply in a scratch index, write-tree, diff-tree (no in-process read)."""
    with repo._scratch_index(base) as index:
        repo._apply_cached(index, diff, check_only=False)
        tree = repo._git("write-tree", env={"GIT_INDEX_FILE": index})
    return repo._diff_tree(base, tree)


def test_changes_read_in_process_equal_git_diff_tree(hostile_target: Path) -> None:
    """Every hostile diff that git applies, and a plain edit: the same PathChanges as
    write-tree + diff-tree, before committing (admission) and for the commit the loop runs
    (commit_proposal, against git's diff-tree of that commit); a diff that does not apply is a
    PatchError with git's words on both paths."""
    repo = GitRepo(hostile_target)
    head = repo.head("HEAD")
    compared = 0
    for name, diff in {**all_cases(hostile_target), "good": good_hunk(hostile_target)}.items():
        try:
            expected = _slow_changes(repo, head, diff)
        except Exception:  # git refuses it: so must the fast path, with git's message
            with pytest.raises(PatchError):
                repo.tree_changes(head, diff)
            with pytest.raises(PatchError):
                repo.commit_proposal(head, diff, "refused")
            continue
        assert repo.tree_changes(head, diff) == expected, name
        commit, changes = repo.commit_proposal(head, diff, name)
        assert changes == expected == committed_changes(repo, commit), name
        compared += 1
    assert compared >= 5  # the git-only cases and the good edit did apply


def test_an_index_it_cannot_read_falls_back_to_git(hostile_target: Path, tmp_path: Path) -> None:
    """Version 4 (prefix-compressed paths) is not read in-process: None, and git answers."""
    index = tmp_path / "v4.index"
    env_git = ["git", "-c", "index.version=4", "read-tree", "HEAD"]
    subprocess.run(env_git, cwd=hostile_target, check=True,
                   env={"GIT_INDEX_FILE": str(index), "PATH": "/usr/bin:/bin",
                        "GIT_INDEX_VERSION": "4"})
    assert index.read_bytes()[:8] == b"DIRC\x00\x00\x00\x04"
    assert read_index(index.read_bytes(), 20) is None
    v2 = tmp_path / "v2.index"
    subprocess.run(["git", "read-tree", "HEAD"], cwd=hostile_target, check=True,
                   env={"GIT_INDEX_FILE": str(v2), "PATH": "/usr/bin:/bin",
                        "GIT_INDEX_VERSION": "2"})
    entries = read_index(v2.read_bytes(), 20)
    assert entries is not None
    listed = _git(hostile_target, "ls-tree", "-r", "HEAD").splitlines()
    assert {p.encode(): (int(m, 8), bytes.fromhex(sha)) for m, _t, sha, p in
            (line.replace("\t", " ").split(" ") for line in listed)} == entries
    assert read_index(b"DIRC" + v2.read_bytes()[4:-25], 20) is None  # truncated
