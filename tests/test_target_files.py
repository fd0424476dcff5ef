"""Protected directories, assets outside git and a working directory, on real git targets."""

from __future__ import annotations

from pathlib import Path

import pytest
from foreground import run_sweep

from agent.core.config import load_config
from agent.core.domain import ExperimentStatus, Proposal
from agent.core.errors import ConfigError
from agent.git.repo import GitRepo, hash_worktree_files
from agent.ops.sweeps import create_sweep
from agent.proposers.knobs import make_diff

TOML = """[target]
command   = "{command}"
editable  = ["{editable}"]
protected = [{protected}]
metric    = "val_bpb"
budget_s  = 1
timeout_s = 30
{extra}
"""

# Reads its data (a protected folder, or an asset outside git) and prints the contract's block.
TRAIN = """import os, pathlib, sys
LR = 0.01
DATA = pathlib.Path(os.environ.get("DATA_DIR", "{data}"))
text = (DATA / "train.txt").read_text()
{tamper}
print("step 1 | loss 2.0 | elapsed 0.1s")
print("---")
print(f"val_bpb: {{len(text) / 100 + abs(LR - 0.02):.6f}}")
print("training_seconds: 0.1")
"""


def write_target(root: Path, *, data: str = "data/wikitext-2", protected: str = "",
                 extra: str = "", train: str = "train.py", tamper: str = "",
                 command: str = "python train.py") -> Path:
    root.mkdir(parents=True)
    (root / train).parent.mkdir(parents=True, exist_ok=True)
    (root / train).write_text(TRAIN.format(data=data, tamper=tamper))
    (root / "overnight.toml").write_text(
        TOML.format(command=command, editable=train, protected=protected, extra=extra)
    )
    return root


def write_data(folder: Path) -> None:
    (folder / "sub").mkdir(parents=True)
    (folder / "train.txt").write_text("hello world " * 10)
    (folder / "sub" / "valid.txt").write_text("valid")


def baseline(store, make_loop, target: Path, name: str = "s1"):
    sweep = create_sweep(store, GitRepo(target), target, name=name, config=load_config(target))
    run_sweep(make_loop(target), sweep.name)
    return store.list_experiments(sweep.id)[0]


def test_a_protected_directory_hashes_the_same_in_git_and_on_disk(tmp_path):
    target = write_target(tmp_path / "t", protected='"data/wikitext-2", "overnight.toml"')
    write_data(target / "data" / "wikitext-2")
    make_target_repo(target)
    repo = GitRepo(target)
    in_git = repo.file_hashes(repo.head("HEAD"), ["data/wikitext-2", "train.py", "nope"])
    on_disk = hash_worktree_files(target, ["data/wikitext-2", "train.py", "nope"])
    assert in_git == on_disk
    assert in_git["nope"] == "missing" and len(in_git["data/wikitext-2"]) == 40
    (target / "data" / "wikitext-2" / "sub" / "valid.txt").write_text("changed")
    assert hash_worktree_files(target, ["data/wikitext-2"]) != {
        "data/wikitext-2": in_git["data/wikitext-2"]}


def make_target_repo(path: Path) -> None:
    from agent.git.repo import init_repo

    init_repo(path)


def test_protected_data_folder_lets_the_baseline_run(store, make_loop, tmp_path):
    target = write_target(tmp_path / "t", protected='"data/wikitext-2", "overnight.toml"')
    write_data(target / "data" / "wikitext-2")
    make_target_repo(target)
    first = baseline(store, make_loop, target)
    assert first.status is ExperimentStatus.KEPT, first.reason


def test_a_run_that_writes_into_a_protected_folder_is_caught(store, make_loop, tmp_path):
    tamper = '(DATA / "sub" / "new.txt").write_text("x")'
    target = write_target(tmp_path / "t", protected='"data/wikitext-2"', tamper=tamper)
    write_data(target / "data" / "wikitext-2")
    make_target_repo(target)
    first = baseline(store, make_loop, target)
    assert first.status is ExperimentStatus.CRASHED
    assert "data/wikitext-2" in first.reason


def ignored_data_target(tmp_path: Path, **kw) -> Path:
    """A target whose script lives in sub/dir and whose data folder is git-ignored."""
    target = write_target(tmp_path / "t", train="sub/dir/train.py", **kw)
    (target / ".gitignore").write_text("data/\n")
    write_data(target / "data" / "wikitext-2")
    make_target_repo(target)
    assert "data/wikitext-2/train.txt" not in GitRepo(target)._git("ls-files")
    return target


def test_assets_outside_git_are_linked_into_every_run_from_the_workdir(store, make_loop, tmp_path):
    target = ignored_data_target(
        tmp_path, data="../../data/wikitext-2", extra='workdir = "sub/dir"\nassets = ["data"]')
    sweep = create_sweep(store, GitRepo(target), target, name="s1", config=load_config(target))
    text = (target / "sub/dir/train.py").read_text()
    diff = make_diff("sub/dir/train.py", text, text.replace("LR = 0.01", "LR = 0.02"))
    from agent.ops.admission import admit, queue

    queue(store, admit(store, GitRepo(target), sweep, Proposal("lr", diff, "test")))
    run_sweep(make_loop(target), sweep.name)
    exps = store.list_experiments(sweep.id)
    assert [e.status for e in exps] == [ExperimentStatus.KEPT, ExperimentStatus.KEPT]
    assert exps[1].metric < exps[0].metric
    assert (target / "data/wikitext-2/sub/valid.txt").read_text() == "valid"  # links removed only


def test_an_absolute_asset_is_hashed_and_a_run_that_changes_it_is_caught(store, make_loop,
                                                                           tmp_path):
    shared = tmp_path / "shared"
    write_data(shared)
    tamper = '(DATA / "train.txt").write_text("short")'
    target = write_target(tmp_path / "t", data=str(shared), tamper=tamper,
                          extra=f'assets = ["{shared}"]')
    make_target_repo(target)
    first = baseline(store, make_loop, target)
    assert first.status is ExperimentStatus.CRASHED and str(shared) in first.reason


def test_a_missing_asset_or_workdir_is_refused_with_the_path_and_creates_nothing(store, tmp_path):
    target = write_target(tmp_path / "t", extra='assets = ["data"]')
    make_target_repo(target)
    with pytest.raises(ConfigError, match=r"assets: data not found .*t/data"):
        create_sweep(store, GitRepo(target), target, name="s1", config=load_config(target))
    other = write_target(tmp_path / "u", extra='workdir = "nope"')
    make_target_repo(other)
    with pytest.raises(ConfigError, match="workdir: nope not found"):
        create_sweep(store, GitRepo(other), other, name="s2", config=load_config(other))
    assert store.list_sweeps() == []
    assert not GitRepo(target).has_ref("refs/heads/overnight/s1")


def test_a_committed_folder_listed_as_asset_is_refused(store, tmp_path):
    target = write_target(tmp_path / "t", extra='assets = ["data"]')
    write_data(target / "data")
    make_target_repo(target)
    with pytest.raises(ConfigError, match="assets: data is committed in git"):
        create_sweep(store, GitRepo(target), target, name="s1", config=load_config(target))
