"""`overnight finalize`: the kept chain replayed as a new branch, and the ablation that attributes
the night's gain to each kept change, on a target with a known interaction.

The night runs through the real loop on tests/fixtures/interaction_target (its metric is a known
function of four switches plus repeatable seed noise: A and B help only together, C stops helping
once D is in); `finalize --ablate` runs as the real CLI in a subprocess, its variants through the
engine's slots, every run recorded; the attribution is checked against the truth.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import git
import pytest
from conftest import FIXTURES, make_target
from foreground import run_sweep

from agent.analysis.ablation import (
    HELPS,
    MORE_TOGETHER,
    NO_LONGER,
    Attribution,
)
from agent.core.config import load_config
from agent.core.diff import make_diff
from agent.core.domain import ExperimentStatus, Proposal, RunStatus
from agent.core.ports import ProposalContext
from agent.engine.loop import Loop, LoopSettings
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo
from agent.ops.finalize import finalize, prepare_ablation
from agent.ops.morning import report_of
from agent.ops.sweeps import create_sweep
from db.engine import open_database
from db.store import SqlStore

OVERNIGHT = Path(sys.executable).parent / "overnight"
TRUTH = {"A": 0.3, "B": 0.3, "C": 0.0, "D": 0.1}  # each switch's gain on top of the others
TOTAL, SUM_OF_GAINS = 0.5, 0.7  # the whole chain's gain; Σ leave-one-out gains (they interact)


class Switches:
    """Proposes the given edits of train.py in order, then nothing."""

    name = "knobs"
    out_of_ideas: str | None = None

    def __init__(self, edits: list[tuple[str, str, str]]) -> None:
        self.edits = list(edits)  # (description, old line, new line)

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        if not self.edits:
            return None
        what, old, new = self.edits.pop(0)
        text = ctx.files["train.py"]
        return Proposal(what, make_diff("train.py", text, text.replace(old, new)), "knobs")

    def repair(self, ctx: ProposalContext, failed: object) -> None:
        return None


def night(root: Path, source: Path, edits: list[tuple[str, str, str]], name: str = "night"
          ) -> tuple[Path, Path, SqlStore]:
    """A target from `source` and a sweep over `edits` through the real loop."""
    target = make_target(root / "target", source)
    db = root / "overnight.db"
    store = SqlStore(open_database(db))
    repo = GitRepo(target)
    create_sweep(store, repo, target, name=name, config=load_config(target),
                 max_experiments=len(edits))
    loop = Loop(store, repo, SubprocessRunner(grace_s=0.5), LoopSettings(root / "work"),
                proposer=Switches(edits))  # type: ignore[arg-type]
    run_sweep(loop, name)
    return target, db, store


def switch(x: str) -> tuple[str, str, str]:
    return (f"USE_{x} on", f"USE_{x} = False", f"USE_{x} = True")


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([str(OVERNIGHT), *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=600, check=False)


@pytest.fixture(scope="module")
def interacting(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, SqlStore]:
    return night(tmp_path_factory.mktemp("interaction"), FIXTURES / "interaction_target",
                 [switch(x) for x in "ABCD"])


def test_the_night_keeps_every_switch(interacting):
    """The precondition: on the strict rule the night kept A (its one run was lucky: it does
    nothing alone), then B, C and D."""
    _, _, store = interacting
    sweep = store.get_sweep("night")
    kept = [e.description for e in store.list_experiments(sweep.id, [ExperimentStatus.KEPT])
            if not e.is_baseline]
    assert kept == ["USE_A on", "USE_B on", "USE_C on", "USE_D on"]


def test_ablation_recovers_a_known_interaction(interacting, tmp_path):
    target, db, store = interacting
    sweep = store.get_sweep("night")
    user_head = git.Repo(target).head.commit.hexsha
    sweep_head = GitRepo(target).head(sweep.branch)
    proc = cli("finalize", "--sweep", "night", "--ablate", "--seeds", "3", "--db", str(db),
               "--work-dir", str(tmp_path / "work"), cwd=tmp_path)
    print(proc.stdout[-4000:], proc.stderr[-2000:])
    assert proc.returncode == 0, proc.stderr
    assert "branch: overnight-final/night" in proc.stdout
    # Nothing that existed moved.
    assert git.Repo(target).head.commit.hexsha == user_head
    assert GitRepo(target).head(sweep.branch) == sweep_head

    a = report_of(store, "night").attribution
    assert isinstance(a, Attribution) and a.seeds == 3
    by_name = {c.description[-4]: c for c in a.changes}  # "USE_A on" → "A"
    for name, truth in TRUTH.items():
        c = by_name[name]
        assert c.gain is not None and c.ci is not None
        assert abs(c.gain - truth) <= c.ci, (name, c.gain, c.ci, truth)
    assert a.total is not None and a.total_ci is not None
    assert abs(a.total - TOTAL) <= a.total_ci
    assert a.interaction is not None and a.interaction_ci is not None
    assert abs(a.interaction - (SUM_OF_GAINS - TOTAL)) <= a.interaction_ci
    assert a.additive is False  # the changes interact
    # A helps only with B (it was kept on a lucky run); C no longer helps once D is in.
    assert by_name["A"].verdict == MORE_TOGETHER
    assert by_name["B"].verdict == HELPS and by_name["D"].verdict == HELPS
    assert by_name["C"].verdict == NO_LONGER and by_name["C"].flagged

    # Every ablation run is recorded: 6 variants × 3 seeds, the same seeds for each.
    abl = store.get_sweep("night-ablate")
    assert abl.proposer == "ablation:night" and abl.status.value == "done"
    runs = store.list_runs(sweep_id=abl.id)
    assert len(runs) == 18 and all(r.status is RunStatus.OK for r in runs)
    seeds: dict[int, list[int]] = {}
    for r in runs:
        seeds.setdefault(r.experiment_id, []).append(r.seed)
    assert sorted(seeds.values()) == [[42, 43, 44]] * 6
    assert a.runs == 18
    # The report shows it.
    md = cli("report", "--sweep", "night", "--db", str(db), cwd=tmp_path).stdout
    assert ("## Attribution (leave-one-out, sweep `night-ablate`, 3 seeds per variant, 18 runs)"
            in md)
    assert "no longer helps on top of the others" in md
    assert "they do not add up: the changes interact" in md


def test_finalize_replays_the_chain_with_its_evidence(tmp_path):
    target, db, store = night(tmp_path, FIXTURES / "fake_target",
                              [("LR up", "LR = 0.01", "LR = 0.02"),
                               ("LR further up", "LR = 0.02", "LR = 0.04"),
                               ("trick on", "USE_TRICK = False", "USE_TRICK = True")])
    sweep = store.get_sweep("night")
    repo = GitRepo(target)
    before = {b.name: b.commit.hexsha for b in git.Repo(target).branches}
    done = finalize(store, repo, sweep)
    assert done.branch == "overnight-final/night"
    kept = [e for e in store.list_experiments(sweep.id, [ExperimentStatus.KEPT])
            if not e.is_baseline]
    assert [i for i, _ in done.commits] == [e.id for e in kept] and len(kept) == 3
    log = git.Repo(target).git.log("--format=%B%x00", "overnight-final/night").split("\x00")
    messages = [m.strip() for m in log if m.strip()][:3][::-1]
    for e, message in zip(kept, messages, strict=True):
        assert message.startswith(e.description)
        assert f"Overnight-Experiment: {e.id}" in message and "Evidence: val_bpb" in message
        assert f"Overnight-Commit: {e.commit}" in message
    # The tip is the best's tree, on the baseline; no existing branch moved; a second finalize
    # gets a new name.
    assert repo.diff(done.tip, sweep.best_commit or "").strip() == ""
    assert git.Repo(target).git.merge_base("overnight-final/night", sweep.branch) == \
        store.list_experiments(sweep.id)[0].commit
    assert {b.name: b.commit.hexsha for b in git.Repo(target).branches
            if b.name in before} == before
    assert finalize(store, repo, sweep).branch == "overnight-final/night-2"

    # LR further up rewrites LR up's line: the best without LR up cannot be built, and is
    # recorded rejected with the reason; the others are queued with their commits.
    abl = prepare_ablation(store, repo, sweep, done, seeds=2)
    rows = store.list_experiments(abl.id)
    assert rows[0].is_baseline and rows[0].base_commit == done.tip
    rejected = [e for e in rows if e.status is ExperimentStatus.REJECTED]
    assert [e.description for e in rejected] == [f"the best without #{kept[0].id}: LR up"]
    assert f"#{kept[1].id} does not apply without #{kept[0].id}" in (rejected[0].reason or "")
    queued = [e for e in rows if e.status is ExperimentStatus.QUEUED and not e.is_baseline]
    assert len(queued) == 3 and all(repo.has_ref(e.meta["ablation"]["commit"]) for e in queued)
    assert abl.config.baseline_runs == 2 and abl.max_experiments == 4


def test_finalize_refuses_what_cannot_be_ablated(tmp_path):
    from agent.core.errors import ConflictError

    target, db, store = night(tmp_path, FIXTURES / "fake_target",
                              [("LR down", "LR = 0.01", "LR = 0.005")])
    sweep = store.get_sweep("night")
    done = finalize(store, GitRepo(target), sweep)  # nothing kept: the baseline, as a branch
    assert done.commits == () and done.tip == done.base
    with pytest.raises(ConflictError, match="kept no change: there is nothing to ablate"):
        prepare_ablation(store, GitRepo(target), sweep, done, seeds=3)
    proc = cli("finalize", "--sweep", "nope", "--db", str(db), cwd=tmp_path)
    assert proc.returncode == 2 and "nope" in proc.stderr


def test_finalize_refuses_a_replayed_chain_that_does_not_end_on_the_best_commit(tmp_path):
    """The store's best is a commit the kept changes do not replay to (one more edit than the
    chain has): finalize says so and makes no branch, rather than hand over another tree."""
    from agent.core.errors import ConflictError

    target, _, store = night(tmp_path, FIXTURES / "fake_target",
                             [("LR up", "LR = 0.01", "LR = 0.02")])
    sweep = store.get_sweep("night")
    repo = GitRepo(target)
    kept = [e for e in store.list_experiments(sweep.id, [ExperimentStatus.KEPT])
            if not e.is_baseline]
    assert [e.description for e in kept] == ["LR up"] and kept[0].commit == sweep.best_commit
    text = repo.read_file(sweep.best_commit or "", "train.py")
    elsewhere, _ = repo.commit_proposal(
        sweep.best_commit or "",
        make_diff("train.py", text, text.replace("USE_TRICK = False", "USE_TRICK = True")),
        "not a kept change")
    store.set_best(sweep.id, kept[0].id, kept[0].metric or 0.0, elsewhere, baseline=False)
    sweep = store.get_sweep("night")
    assert sweep.best_commit == elsewhere
    with pytest.raises(ConflictError, match=f"the replayed chain of night does not end on its "
                                            f"best commit {elsewhere[:7]}; nothing was made"):
        finalize(store, repo, sweep)
    assert not [b.name for b in git.Repo(target).branches
                if b.name.startswith("overnight-final/")]
