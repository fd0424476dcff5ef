"""`overnight confirm` (and `run --confirm-at`): a night's baseline and best re-run at a larger
setting, k seeds each, on a target whose truth is known (tests/fixtures/scale_target): USE_GOOD's
5 % holds at any scale, USE_FAST's gain flips from scale 5 on (a larger budget or WIDTH).

The nights run through the real loop (real git, real subprocesses); the confirmations run as
the real CLI in a subprocess, their runs through the engine's slots, every run recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import git
import pytest
from conftest import FIXTURES, make_target
from foreground import run_sweep

from agent.analysis.confirm import FLIPS, HOLDS
from agent.core.budget import ComputeBudget
from agent.core.config import load_config
from agent.core.diff import make_diff
from agent.core.domain import Proposal, RunStatus
from agent.core.ports import ProposalContext
from agent.engine.loop import Loop, LoopSettings
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo
from agent.ops.morning import report_of
from agent.ops.sweeps import create_sweep
from db.engine import open_database
from db.store import SqlStore

OVERNIGHT = Path(sys.executable).parent / "overnight"
SOURCE = FIXTURES / "scale_target"


class Edits:
    """Proposes the given edits of train.py in order, then nothing."""

    name = "knobs"
    out_of_ideas: str | None = None

    def __init__(self, edits: list[tuple[str, str, str]]) -> None:
        self.edits = list(edits)

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        if not self.edits:
            return None
        what, old, new = self.edits.pop(0)
        text = ctx.files["train.py"]
        return Proposal(what, make_diff("train.py", text, text.replace(old, new)), "knobs")

    def repair(self, ctx: ProposalContext, failed: object) -> None:
        return None


def night(root: Path, switch: str) -> tuple[Path, Path, SqlStore]:
    """A scale target and a night that keeps USE_<switch>."""
    target = make_target(root / "target", SOURCE)
    db = root / "overnight.db"
    store = SqlStore(open_database(db))
    repo = GitRepo(target)
    create_sweep(store, repo, target, name="night", config=load_config(target),
                 max_experiments=1)
    edit = (f"USE_{switch} on", f"USE_{switch} = False", f"USE_{switch} = True")
    loop = Loop(store, repo, SubprocessRunner(grace_s=0.5), LoopSettings(root / "work"),
                proposer=Edits([edit]))  # type: ignore[arg-type]
    run_sweep(loop, "night")
    sweep = store.get_sweep("night")
    assert sweep.best_commit and [e.description for e in store.list_experiments(sweep.id)
                                  if e.status.value == "kept"] == ["baseline", edit[0]]
    return target, db, store


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([str(OVERNIGHT), *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=600, check=False)


def confirm(db: Path, at: str, work: Path) -> subprocess.CompletedProcess[str]:
    proc = cli("confirm", "--sweep", "night", "--at", at, "--seeds", "3", "--db", str(db),
               "--work-dir", str(work), cwd=work.parent)
    print(proc.stdout[-3000:], proc.stderr[-2000:])
    return proc


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, SqlStore]:
    return night(tmp_path_factory.mktemp("good"), "GOOD")


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, SqlStore]:
    return night(tmp_path_factory.mktemp("fast"), "FAST")


def test_a_gain_that_holds_at_a_larger_budget(good, tmp_path):
    target, db, store = good
    user_head = git.Repo(target).head.commit.hexsha
    before = report_of(store, "night")
    assert before.confirmation is None and any(  # nothing confirmed yet: the report says how
        "`overnight confirm --sweep night --at budget=10`" in s for s in before.next_steps)
    proc = confirm(db, "budget=20", tmp_path / "work")
    assert proc.returncode == 0, proc.stderr
    assert "the gain holds" in proc.stdout

    c = report_of(store, "night").confirmation
    assert c is not None and c.verdict == HOLDS and c.at == "budget=20"
    assert c.relative is not None and c.relative_ci is not None
    assert abs(c.relative - 0.05) <= c.relative_ci  # the truth: 5 % at every scale
    conf = store.get_sweep(c.sweep)
    assert conf.proposer == "confirm:night" and conf.status.value == "done"
    assert conf.config.budget_s == 20 and conf.config.baseline_runs == 3
    runs = store.list_runs(sweep_id=conf.id)
    assert len(runs) == 6 and all(r.status is RunStatus.OK for r in runs) and c.runs == 6
    by_exp: dict[int, list[int]] = {}
    for r in runs:
        by_exp.setdefault(r.experiment_id, []).append(r.seed)
    assert sorted(by_exp.values()) == [[42, 43, 44]] * 2  # the same seeds for both
    night_sweep = store.get_sweep("night")
    commits = {r.commit for r in runs}
    baseline = store.list_experiments(night_sweep.id)[0].commit
    assert commits == {night_sweep.best_commit, baseline}  # a budget changes no file
    assert git.Repo(target).head.commit.hexsha == user_head

    # Shown in the report (Markdown and HTML) and in results --format json.
    md = cli("report", "--sweep", "night", "--db", str(db), cwd=tmp_path).stdout
    assert f"## Does the gain hold at scale? (`budget=20`, sweep `{c.sweep}`, 3 seeds each, " \
           "6 runs)" in md and "**the gain holds**" in md
    html = cli("report", "--sweep", "night", "--format", "html", "--db", str(db),
               cwd=tmp_path).stdout
    assert 'id="confirmation"' in html and "the gain holds" in html
    out = json.loads(cli("results", "--sweep", "night", "--format", "json", "--db", str(db),
                         cwd=tmp_path).stdout)
    assert out["confirmation"]["verdict"] == "holds"
    assert out["confirmation"]["baseline_n"] == 3 and out["confirmation"]["best_n"] == 3


def test_a_gain_that_flips_at_a_larger_budget(fast, tmp_path):
    _, db, store = fast
    proc = confirm(db, "budget=20", tmp_path / "work")
    assert proc.returncode == 0, proc.stderr
    c = report_of(store, "night").confirmation
    assert c is not None and c.verdict == FLIPS and c.gain is not None and c.gain_ci is not None
    assert abs(c.gain - -0.05) <= c.gain_ci  # the truth at scale 20: 0.05 worse
    assert c.night_relative is not None and c.night_relative > 0  # it helped at night
    assert "the gain flips" in proc.stdout
    # What to try next says so first, and that the holdout (which USE_FAST does not help)
    # does not share the validation gain.
    steps = report_of(store, "night").next_steps
    assert steps[0].startswith("the gain flips at `budget=20`")
    assert any(s.startswith("the holdout does not share the validation gain") for s in steps)


def test_a_gain_that_flips_at_a_larger_size_knob(fast, tmp_path):
    target, db, store = fast
    proc = confirm(db, "WIDTH=32", tmp_path / "work")
    assert proc.returncode == 0, proc.stderr
    c = report_of(store, "night").confirmation  # the newest confirmation
    assert c is not None and c.at == "WIDTH=32" and c.verdict == FLIPS
    conf = store.get_sweep(c.sweep)
    assert conf.config.budget_s == 1  # the budget stays the night's
    # Both ran with the same one-line change: WIDTH = 32 in train.py, nothing else.
    commits = {r.commit for r in store.list_runs(sweep_id=conf.id)}
    repo = GitRepo(target)
    sweep = store.get_sweep("night")
    originals = [sweep.best_commit, store.list_experiments(sweep.id)[0].commit]
    assert len(commits) == 2 and not commits & set(originals)
    for sha in commits:
        assert "WIDTH = 32  # the size knob" in repo.read_file(sha, "train.py")
    changed = sorted(repo.diff(o, n, context=0).count("\n+WIDTH") for o, n in zip(
        originals, [conf.best_commit, *(commits - {conf.best_commit})], strict=True))
    assert changed == [1, 1]


@pytest.mark.parametrize(("at", "words"), [
    ("budget", "expected KEY=VALUE"),
    ("budget=long", "budget must be \"600 steps\" or \"2M tokens\" (or seconds: 300), got 'long'"),
    ("budget=0.5 steps", "budget must be a whole number of steps ≥ 1, got '0.5 steps'"),
    ("budget=-5", "budget must be a positive number of seconds"),
    ("9lives=3", "unknown key '9lives'"),
    ("DEPTH=8", "has no size knob DEPTH"),
    ("WIDTH=wide", "WIDTH must be given a number"),
])
def test_bad_settings_are_refused_and_change_nothing(fast, tmp_path, at, words):
    target, db, store = fast
    sweeps = [s.name for s in store.list_sweeps()]
    refs = git.Repo(target).git.for_each_ref()
    proc = confirm(db, at, tmp_path / "work")
    assert proc.returncode != 0 and words in proc.stderr.replace("\n", " "), proc.stderr
    assert [s.name for s in store.list_sweeps()] == sweeps
    assert git.Repo(target).git.for_each_ref() == refs


@pytest.mark.parametrize(("at", "budget", "text"), [
    ("budget=1800", 1800.0, "budget=1800"), ("budget= 90 s", 90.0, "budget=90"),
    ("budget=2000 steps", ComputeBudget(2000, "steps"), "budget=2k steps"),
    ("budget=4M tokens", ComputeBudget(4_000_000, "tokens"), "budget=4M tokens"),
])
def test_a_confirmation_takes_a_budget_of_seconds_or_a_compute_budget(at, budget, text):
    """A night on a compute budget is confirmed on a larger one: the setting is the budget the
    confirmation sweep's config gets (agent.ops.confirm.prepare_confirm: with_budget)."""
    from agent.analysis.confirm import parse_at
    from agent.core.config import TargetConfig

    found = parse_at(at)
    assert (found.budget, found.text()) == (budget, text)
    config = TargetConfig.from_dict({"command": "python train.py", "metric": "val_bpb",
                                     "editable": ["train.py"], "budget": "20 steps"}
                                    ).with_budget(found.budget)
    assert (config.budget, config.time_budget) == (
        (budget, False) if isinstance(budget, ComputeBudget) else (None, True))


def test_run_refuses_a_bad_confirm_at_before_the_night(tmp_path):
    target = make_target(tmp_path / "target", SOURCE)
    db = tmp_path / "o.db"
    for at, words in (("DEPTH=8", "has no size knob DEPTH"),
                      ("budget=0", "budget must be a positive number")):
        proc = cli("run", "--target", str(target), "--experiments", "1", "--confirm-at", at,
                   "--db", str(db), cwd=tmp_path)
        assert proc.returncode != 0 and words in proc.stderr.replace("\n", " "), proc.stderr
    assert not db.exists() or SqlStore(open_database(db)).list_sweeps() == []


def test_nothing_kept_is_nothing_to_confirm(tmp_path):
    from agent.analysis.confirm import parse_at
    from agent.core.errors import ConflictError
    from agent.ops.confirm import prepare_confirm

    target = make_target(tmp_path / "target", SOURCE)
    store = SqlStore(open_database(tmp_path / "o.db"))
    repo = GitRepo(target)
    create_sweep(store, repo, target, name="night", config=load_config(target),
                 max_experiments=0)
    run_sweep(Loop(store, repo, SubprocessRunner(grace_s=0.5), LoopSettings(tmp_path / "w"),
                   proposer=Edits([])), "night")  # type: ignore[arg-type]
    with pytest.raises(ConflictError, match="kept no change: there is no gain to confirm"):
        prepare_confirm(store, repo, store.get_sweep("night"), parse_at("budget=5"), 3)
    assert [s.name for s in store.list_sweeps()] == ["night"]


def test_another_device_is_the_runs_device(good, tmp_path):
    """`device=NAME` reaches each run as OVERNIGHT_DEVICE and is recorded on it; the fake
    trainer ignores it, so the gain holds."""
    _, db, store = good
    proc = confirm(db, "device=cpu:7", tmp_path / "work")
    assert proc.returncode == 0, proc.stderr
    c = report_of(store, "night").confirmation
    assert c is not None and c.at == "device=cpu:7" and c.verdict == HOLDS
    runs = store.list_runs(sweep_id=store.get_sweep(c.sweep).id)
    assert len(runs) == 6 and {r.device for r in runs} == {"cpu:7"}
