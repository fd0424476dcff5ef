"""Admission from git's own view: hostile diffs (real git) are refused before a run is queued.

The diff is read with "\\n" line ends only (agent.core.diff), and what git actually changed (the
applied tree against its parent) is checked against `editable` at admission and again before
a run. Git hooks never run as the service.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import git
import pytest
from conftest import FIXTURES, make_target
from hostile_diffs import README, all_cases, committed_changes, git_only, good_hunk, smuggled

from agent.core.config import load_config
from agent.core.diff import PathChange, parse, split_lines
from agent.core.domain import ExperimentStatus, Proposal
from agent.core.errors import AdmissionError
from agent.git.repo import GitRepo
from agent.ops.admission import admit, queue
from agent.ops.sweeps import create_sweep
from agent.rules.admit import check_proposal


@pytest.fixture
def hostile_target(tmp_path: Path) -> Path:
    return make_target(tmp_path / "target", edits={"README.md": README, "empty.txt": ""})


@pytest.fixture
def sweep(store, hostile_target):  # type: ignore[no-untyped-def]
    return create_sweep(store, GitRepo(hostile_target), hostile_target, name="hv",
                        config=load_config(hostile_target))


def test_every_hostile_diff_is_refused_and_nothing_is_queued(store, hostile_target, sweep):
    repo = GitRepo(hostile_target)
    head = repo.head(sweep.branch)
    before = store.count_experiments(sweep.id)
    admitted = []
    for name, diff in all_cases(hostile_target).items():
        try:
            queue(store, admit(store, repo, sweep, Proposal("try it", diff)))
        except AdmissionError:
            continue
        admitted.append(name)
    assert admitted == []
    assert store.count_experiments(sweep.id) == before
    assert repo.head(sweep.branch) == head


def test_lines_end_at_newline_only_as_in_git(hostile_target):
    diff = smuggled(hostile_target)["readme_behind_x1c"]
    assert [(p.old_path, p.new_path) for p in parse(diff)] == [
        ("train.py", "train.py"), ("README.md\x1cx", "README.md")]
    assert split_lines("a\x1cb\rc\x85d\u2028e\n") == ["a\x1cb\rc\x85d\u2028e"]


@pytest.mark.parametrize("name", ["empty_new_file_after", "delete_empty_readme_like"])
def test_git_view_refuses_what_the_text_reader_cannot_see(store, hostile_target, sweep, name):
    diff = git_only(hostile_target)[name]
    config = load_config(hostile_target)
    check_proposal(Proposal("try it", diff), config)  # the text alone looks fine
    with pytest.raises(AdmissionError) as exc:
        queue(store, admit(store, GitRepo(hostile_target), sweep, Proposal("try it", diff)))
    assert exc.value.code == "not_editable"
    assert any(p in exc.value.message for p in ("evil.py", "empty.txt"))


def test_git_reports_modes_and_paths_of_a_commit(hostile_target):
    repo = GitRepo(hostile_target)
    head = repo.head("HEAD")
    changes = repo.tree_changes(head, good_hunk(hostile_target))
    assert changes == [PathChange("M", "100644", "100644", "train.py")]
    commit = repo.commit_proposal(head, git_only(hostile_target)["empty_new_file_after"], "x")[0]
    assert committed_changes(repo, commit) == [
        PathChange("A", "000000", "100644", "evil.py"),
        PathChange("M", "100644", "100644", "train.py"),
    ]


def test_a_queued_row_that_skipped_admission_never_runs(store, hostile_target, sweep, make_loop):
    """A row written straight into the queue (as a run with database access could) is checked
    again from git's view before it runs."""
    loop = make_loop(hostile_target)
    loop.execute(sweep, store.claim_next(sweep.id))  # the baseline
    diff = git_only(hostile_target)["empty_new_file_after"]
    exp = store.add_experiment(sweep.id, Proposal("sneaky", diff, "scripted"))
    done = loop.execute(sweep, store.claim(exp.id))
    assert done.status is ExperimentStatus.REJECTED
    assert "evil.py" in (done.reason or "") and done.log_path is None
    repo = GitRepo(hostile_target)
    assert repo.file_hashes(repo.head(sweep.branch), ["evil.py"]) == {"evil.py": "missing"}


def _plant_hook(target: Path, marker: Path) -> None:
    hook = target / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\necho ran >> {marker}\n")
    hook.chmod(0o755)


def test_git_hooks_planted_in_the_target_never_run(store, hostile_target, sweep, make_loop,
                                                   tmp_path):
    marker = tmp_path / "hook-ran"
    _plant_hook(hostile_target, marker)
    # The hook is live for plain git (so this test can fail) ...
    subprocess.run(["git", "worktree", "add", "--detach", str(tmp_path / "plain"), "HEAD"],
                   cwd=hostile_target, check=True, capture_output=True)
    assert marker.read_text() == "ran\n"
    marker.unlink()
    # ... and the service's own worktree add (and every other git call) does not run it.
    done = make_loop(hostile_target).execute(sweep, store.claim_next(sweep.id))
    assert done.status is ExperimentStatus.KEPT and done.commit
    assert not marker.exists()


def test_init_repo_does_not_run_commit_hooks(tmp_path):
    from agent.git.repo import init_repo

    target = tmp_path / "t"
    target.mkdir()
    git.Repo.init(target)
    marker = tmp_path / "pre-commit-ran"
    hook = target / ".git" / "hooks" / "pre-commit"
    hook.write_text(f"#!/bin/sh\necho ran >> {marker}\nexit 1\n")
    hook.chmod(0o755)
    (target / "train.py").write_text("x = 1\n")
    init_repo(target)
    assert not marker.exists()
    assert git.Repo(target).head.is_valid()
    assert os.access(hook, os.X_OK)


def test_fixture_target_has_the_files_the_corpus_needs():
    assert (FIXTURES / "fake_target" / "train.py").is_file()


@pytest.mark.parametrize("old,new", [
    ("a\x0cb = 1\nc = 2\n", "a\x0cb = 1\nc = 3\n"),  # form feed inside a line
    ("x = 1\ny = 2", "x = 1\ny = 3"),  # no newline at the end of the file
    ("s = 'a\x1cb\u2028c'\n", "s = 'a\x1cb\u2028d'\n"),
])
def test_written_diffs_apply_with_git_exactly(tmp_path, old, new):
    from agent.core.diff import make_diff

    target = make_target(tmp_path / "t", edits={"train.py": old})
    repo = GitRepo(target)
    head = repo.head("HEAD")
    diff = make_diff("train.py", old, new)
    assert [p.path for p in parse(diff)] == ["train.py"]
    commit = repo.commit_proposal(head, diff, "edit")[0]
    assert git.Repo(target).git.show(f"{commit}:train.py", strip_newline_in_stdout=False) == new
