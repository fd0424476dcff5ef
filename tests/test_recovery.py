"""Restart recovery on a real store and real git: reap, kill orphans, re-queue once, repair."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from service_fixtures import knob_diff, make_counting_target, wait_for

from agent.core.domain import (
    CrashKind,
    Experiment,
    ExperimentStatus,
    Finish,
    Proposal,
    RunRole,
    RunSpec,
    SweepStatus,
)
from agent.core.ports import SweepSpec
from agent.engine.loop import Loop, LoopSettings
from agent.engine.recovery import (
    SHUTDOWN_REASON,
    InstanceLock,
    InstanceLockError,
    recover,
)
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo
from agent.ops.service import Service
from agent.ops.sweeps import create_sweep
from agent.rules.endings import MAX_CRASH_RETRIES
from db.engine import open_database
from db.store import SqlStore
from runner.groups import process_group_alive

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture
def world(tmp_path: Path):  # type: ignore[no-untyped-def]
    target = make_counting_target(tmp_path / "target", n_knobs=10)
    store = SqlStore(open_database(tmp_path / "o.db"))
    repo = GitRepo(target)
    sweep = create_sweep(store, repo, target, name="s", proposer="queue")
    work = tmp_path / "work"
    loop = Loop(store, repo, SubprocessRunner(grace_s=0.5), LoopSettings(work_dir=work))
    loop.execute(sweep, store.claim_next(sweep.id))  # the baseline, kept
    return target, store, repo, work, loop


def _orphan(work: Path) -> subprocess.Popen[bytes]:
    """A 'training run' left behind by a dead service: own session, cwd in a worktree."""
    wt = work / "worktrees" / "s" / "exp-2"
    wt.mkdir(parents=True)
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=wt,
                            start_new_session=True)


def test_reap_kill_requeue_once_and_prune(world) -> None:  # type: ignore[no-untyped-def]
    target, store, repo, work, loop = world
    sweep = store.get_sweep("s")
    exp = store.add_experiment(sweep.id, Proposal("K1", knob_diff(target, 1, 1)), priority=3)
    running_code(store, exp)
    child = _orphan(work)
    store.mark_started(exp.id, pgid=child.pid)

    report = recover(store, lambda s: repo, work)
    child.wait(10)
    assert not process_group_alive(child.pid)
    assert report.interrupted == [exp.id] and report.killed_groups == [child.pid]
    assert store.get_experiment(exp.id).status is ExperimentStatus.INTERRUPTED
    retry = store.get_experiment(report.requeued[exp.id])
    assert retry.status is ExperimentStatus.QUEUED and retry.parent_id == exp.id
    assert retry.meta["retry_of"] == exp.id and retry.priority == 3 and retry.diff == exp.diff
    assert not (work / "worktrees" / "s" / "exp-2").exists()

    again = recover(store, lambda s: repo, work)  # idempotent: nothing more to do
    assert again.interrupted == [] and again.requeued == {}

    # each retry is interrupted by another crash while its code runs: after MAX_CRASH_RETRIES
    # the chain ends in a verdict, so the accepted change is never left without one
    for n in range(2, MAX_CRASH_RETRIES + 1):
        running_code(store, retry)
        report = recover(store, lambda s: repo, work)
        assert report.requeued.keys() == {retry.id}
        retry = store.get_experiment(report.requeued[retry.id])
        assert retry.meta["crash_retries"] == n and retry.parent_id == report.interrupted[0]
    running_code(store, retry)
    last = recover(store, lambda s: repo, work)
    assert last.not_requeued == [retry.id] and last.requeued == {}
    verdict = store.retry_of(retry.id)
    assert verdict is not None and verdict.status is ExperimentStatus.CRASHED
    assert verdict.crash_kind is CrashKind.FUNDAMENTAL and verdict.reason is not None
    assert verdict.reason.startswith("took the service down") and verdict.diff == exp.diff
    assert verdict.record is not None and verdict.record.ending.value == "gave up"
    assert store.count_experiments(statuses=[ExperimentStatus.QUEUED]) == 0
    quiet = recover(store, lambda s: repo, work)  # followed up once: nothing at later starts
    assert quiet.not_requeued == [] and quiet.requeued == {}


def running_code(store: SqlStore, exp: Experiment) -> None:
    """Claimed, and its training script started (a run record): what a crash counts against."""
    assert store.claim(exp.id) is not None
    store.start_run(RunSpec(exp.sweep_id, exp.id, "c", 42, RunRole.SCREEN))


def test_kills_before_its_code_ran_never_count(world) -> None:  # type: ignore[no-untyped-def]
    target, store, repo, work, loop = world
    sweep = store.get_sweep("s")
    exp = store.add_experiment(sweep.id, Proposal("K7", knob_diff(target, 7, 1)))
    for _ in range(MAX_CRASH_RETRIES + 3):  # claimed, then the service died before any run
        store.claim(exp.id)
        exp = store.get_experiment(recover(store, lambda s: repo, work).requeued[exp.id])
    assert exp.status is ExperimentStatus.QUEUED and exp.meta["crash_retries"] == 0


def test_a_baseline_that_takes_the_service_down_pauses_its_sweep(tmp_path: Path) -> None:
    """Never given up silently: past the cap the baseline is queued again and the sweep pauses
    with the reason; resumed, it runs the baseline first."""
    target = make_counting_target(tmp_path / "target", n_knobs=2)
    store = SqlStore(open_database(tmp_path / "o.db"))
    repo, work = GitRepo(target), tmp_path / "work"
    sweep = create_sweep(store, repo, target, name="b", proposer="queue")
    store.add_experiment(sweep.id, Proposal("K1", knob_diff(target, 1, 1)))  # accepted, waiting
    base = store.list_experiments(sweep.id, [ExperimentStatus.QUEUED])[0]
    assert base.is_baseline
    for _ in range(MAX_CRASH_RETRIES + 1):
        running_code(store, base)
        report = recover(store, lambda s: repo, work)
        base = store.get_experiment(report.requeued[base.id])
    assert base.is_baseline and base.status is ExperimentStatus.QUEUED
    assert store.get_sweep("b").status is SweepStatus.PAUSED
    assert "its baseline's run was cut off each of the 4 times" in report.paused["b"]
    assert store.count_experiments(sweep.id, [ExperimentStatus.QUEUED]) == 2  # nothing lost


def test_a_cancel_answered_before_a_crash_sticks(world) -> None:  # type: ignore
    """The service answered a cancel (202) and died before the run stopped: on restart the
    run's processes are killed and the change ends cancelled; it is not re-queued to run again."""
    target, store, repo, work, loop = world
    sweep = store.get_sweep("s")
    exp = store.add_experiment(sweep.id, Proposal("K5", knob_diff(target, 5, 1)))
    store.claim(exp.id)
    child = _orphan(work)
    store.mark_started(exp.id, pgid=child.pid)
    assert store.request_cancel(exp.id, "cancelled by request")  # what Service.cancel records
    report = recover(store, lambda s: repo, work)
    child.wait(10)
    assert report.killed_groups == [child.pid] and report.requeued == {}
    done = store.get_experiment(exp.id)
    assert done.status is ExperimentStatus.CANCELLED and store.retry_of(exp.id) is None
    assert store.count_experiments(sweep.id, [ExperimentStatus.QUEUED]) == 0


def test_half_done_recovery_is_completed(world) -> None:  # type: ignore[no-untyped-def]
    target, store, repo, work, loop = world
    sweep = store.get_sweep("s")
    exp = store.add_experiment(sweep.id, Proposal("K2", knob_diff(target, 2, 1)))
    store.claim(exp.id)
    store.interrupt_running()  # a recovery killed right after reaping
    report = recover(store, lambda s: repo, work)
    assert list(report.requeued) == [exp.id]


def test_clean_shutdown_interrupts_do_not_count(world) -> None:  # type: ignore
    target, store, repo, work, loop = world
    sweep = store.get_sweep("s")
    exp_id = store.add_experiment(sweep.id, Proposal("K3", knob_diff(target, 3, 1))).id
    for _ in range(MAX_CRASH_RETRIES + 2):
        store.claim(exp_id)
        store.finish(exp_id, Finish(ExperimentStatus.INTERRUPTED, reason=SHUTDOWN_REASON))
        exp_id = recover(store, lambda s: repo, work).requeued[exp_id]
    assert store.get_experiment(exp_id).meta["crash_retries"] == 0


def test_branch_repaired_from_the_database(world) -> None:  # type: ignore[no-untyped-def]
    target, store, repo, work, loop = world
    sweep = store.get_sweep("s")
    # a keep recorded in the DB whose branch move was lost (kill -9 between the two)
    exp = store.add_experiment(sweep.id, Proposal("K4", knob_diff(target, 4, 1)))
    exp = store.claim(exp.id)
    head = repo.head(sweep.branch)
    commit = repo.commit_proposal(head, exp.diff, "K4")[0]
    store.finish(exp.id, Finish(ExperimentStatus.KEPT, metric=1.0, best_before=1.3, best=1.0),
                 keep_commit=commit)
    assert repo.head(sweep.branch) == head
    report = recover(store, lambda s: repo, work)
    assert repo.head(sweep.branch) == commit == store.get_sweep("s").best_commit
    assert report.repaired_branches["s"] == (head, commit)
    # the other way round: a branch that moved past the DB is put back
    repo.set_ref(f"refs/heads/{sweep.branch}", repo.commit_proposal(commit, knob_diff(target, 5, 1),
                                                                "stray")[0])
    recover(store, lambda s: repo, work)
    assert repo.head(sweep.branch) == commit


def test_missing_sweep_branch_is_restored_from_the_database(world) -> None:  # type: ignore
    target, store, repo, work, loop = world
    sweep = store.get_sweep("s")
    best = sweep.best_commit
    assert best and repo.head(sweep.branch) == best
    subprocess.run(["git", "branch", "-D", sweep.branch], cwd=target, check=True,
                   capture_output=True)  # by hand
    assert not repo.has_ref(sweep.branch)
    report = recover(store, lambda s: repo, work)
    assert repo.head(sweep.branch) == best
    assert report.repaired_branches == {"s": ("", best)}


def test_a_done_sweeps_branch_is_its_owners(world, caplog) -> None:  # type: ignore
    """A night that ended (done) ran nothing when it ended, so no keep can be half-recorded:
    commits its owner made on its branch afterwards survive a restart. A stopped sweep's
    branch (a run may have been in flight) is still put back."""
    target, store, repo, work, loop = world
    sweep = store.get_sweep("s")
    best = sweep.best_commit
    assert best is not None
    mine = repo.commit_proposal(best, knob_diff(target, 6, 1), "my own change on the night")[0]
    repo.set_ref(f"refs/heads/{sweep.branch}", mine)
    store.set_sweep_status("s", SweepStatus.DONE)
    report = recover(store, lambda s: repo, work)
    assert repo.head(sweep.branch) == mine and report.repaired_branches == {}
    store.set_sweep_status("s", SweepStatus.STOPPED)
    report = recover(store, lambda s: repo, work)
    assert repo.head(sweep.branch) == best and report.repaired_branches == {"s": (mine, best)}


def test_a_gone_target_is_an_error_only_for_a_sweep_that_may_run(world, caplog) -> None:  # type: ignore
    """A year of done nights whose target was deleted logs no errors on every start; an
    unfinished sweep whose target is gone does (once per sweep), and recovery goes on."""
    target, store, repo, work, loop = world
    sweep = store.get_sweep("s")
    store.set_sweep_status("s", SweepStatus.DONE)
    others = [store.create_sweep(SweepSpec(
        name=f"old{i}", target_path=str(target.parent / "gone"), branch=f"overnight/old{i}",
        proposer="knobs", config=sweep.config, protected_hashes={})) for i in range(3)]
    for other in others[:2]:
        store.set_sweep_status(other.name, SweepStatus.DONE)

    def repo_for(s):  # type: ignore[no-untyped-def]
        return repo if s.target_path == str(target) else GitRepo(Path(s.target_path))

    with caplog.at_level("INFO", logger="agent.engine.recovery"):
        recover(store, repo_for, work)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith("sweep old2: cannot open target")
    assert sum("cannot open target" in r.getMessage() for r in caplog.records) == 3


def test_orphan_group_whose_leader_is_gone_is_still_killed(world, tmp_path: Path) -> None:  # type: ignore
    """The recorded pgid's leader exited (and was reaped), but a member of its group still
    runs: the group is ours (a live group's id cannot be reused), so it is killed."""
    target, store, repo, work, loop = world
    sweep = store.get_sweep("s")
    exp = store.add_experiment(sweep.id, Proposal("K7", knob_diff(target, 7, 1)))
    store.claim(exp.id)
    pid_file = tmp_path / "member.pid"
    leader = subprocess.Popen([sys.executable, str(SCRIPTS / "spawn_and_exit.py")],
                              env={**os.environ, "SPAWN_PID_FILE": str(pid_file)},
                              start_new_session=True, stdout=subprocess.DEVNULL)
    assert leader.wait(60) == 0  # the leader is gone for good (reaped)
    member = int(pid_file.read_text())
    assert os.getpgid(member) == leader.pid and process_group_alive(leader.pid)
    assert not Path(f"/proc/{leader.pid}").exists()
    store.mark_started(exp.id, pgid=leader.pid)
    try:
        report = recover(store, lambda s: repo, work)
        assert report.killed_groups == [leader.pid]
        wait_for(lambda: not process_group_alive(leader.pid), 30, "the group to die")
    finally:
        if process_group_alive(leader.pid):
            os.killpg(leader.pid, 9)


def test_stale_ref_lock_removed(world) -> None:  # type: ignore[no-untyped-def]
    target, store, repo, work, loop = world
    lock = target / ".git" / "refs" / "heads" / "overnight" / "s.lock"
    lock.write_text("x")
    recover(store, lambda s: repo, work)
    assert not lock.exists()


def test_reused_pgid_of_a_stranger_is_not_killed(world, tmp_path: Path) -> None:  # type: ignore
    target, store, repo, work, loop = world
    sweep = store.get_sweep("s")
    exp = store.add_experiment(sweep.id, Proposal("K6", knob_diff(target, 6, 1)))
    store.claim(exp.id)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                                cwd=tmp_path, start_new_session=True)
    try:
        store.mark_started(exp.id, pgid=stranger.pid)
        # Popen returns after the child's chdir and exec: its cwd is already the stranger's
        assert Path(os.readlink(f"/proc/{stranger.pid}/cwd")) == tmp_path.resolve()
        report = recover(store, lambda s: repo, work)
        assert report.killed_groups == [] and stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_instance_lock_is_exclusive(tmp_path: Path) -> None:
    first = InstanceLock(tmp_path / "o.db").acquire()
    with pytest.raises(InstanceLockError, match="already using this database"):
        InstanceLock(tmp_path / "o.db").acquire()
    first.release()
    InstanceLock(tmp_path / "o.db").acquire().release()


def test_orphan_that_moved_away_is_killed_by_its_run_id(world, tmp_path: Path) -> None:  # type: ignore
    """A trainer (and its setsid grandchild) that did chdir("/") is found by OVERNIGHT_RUN_ID."""
    import os

    target, store, repo, work, loop = world
    sweep = store.get_sweep("s")
    exp = store.add_experiment(sweep.id, Proposal("K6", knob_diff(target, 6, 1)))
    store.claim(exp.id)
    pid_file = tmp_path / "escaped.pid"
    env = {**os.environ, **loop.training.env(sweep, exp, sweep.seed, run=2),
           "ESCAPE_PID_FILE": str(pid_file)}
    script = Path(__file__).parent / "scripts" / "escape.py"
    trainer = subprocess.Popen([sys.executable, str(script)], cwd="/", env=env,
                               start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        store.mark_started(exp.id, pgid=trainer.pid)
        wait_for(pid_file.exists, 60, "the grandchild to start")
        grandchild = int(pid_file.read_text())
        report = recover(store, lambda s: repo, work)
        assert report.interrupted == [exp.id]
        assert report.killed_groups == []  # matched by folder it would have survived
        assert {trainer.pid, grandchild} <= set(report.killed_pids)
        assert trainer.wait(timeout=10) == -9
        assert not _alive(grandchild)
    finally:
        trainer.kill()
        trainer.wait()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_half_created_worktree_is_pruned(world) -> None:  # type: ignore[no-untyped-def]
    """A kill during `git worktree add` leaves git's entry locked "initializing" (which a plain
    prune keeps, holding its commit): recovery unlocks and prunes it, and only ours."""
    target, store, repo, work, loop = world
    head = repo.head("HEAD")
    ours, theirs = work / "worktrees" / "s" / "exp-9", target.parent / "mine"
    for path in (ours, theirs):
        repo.add_worktree(path, head)
    admin = {Path(p.read_text().strip()).parent.name: p.parent
             for p in (target / ".git" / "worktrees").glob("*/gitdir")}
    for name in ("exp-9", "mine"):
        (admin[name] / "locked").write_text("initializing\n")  # as git leaves a killed `add`
    shutil.rmtree(ours)
    shutil.rmtree(theirs)
    recover(store, lambda s: repo, work)
    listed = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=target,
                            capture_output=True, text=True, check=True).stdout
    assert str(ours) not in listed and not admin["exp-9"].exists()
    assert str(theirs) in listed and (admin["mine"] / "locked").exists()  # not ours: kept


def test_the_service_records_a_cancel_before_it_answers(world) -> None:  # type: ignore
    target, store, repo, work, loop = world
    sweep = store.get_sweep("s")
    exp = store.add_experiment(sweep.id, Proposal("K6", knob_diff(target, 6, 1)))
    store.claim(exp.id)
    asked: list[int] = []
    service = Service(store, lambda s: repo, stop_running=lambda i: asked.append(i) or True)
    _, pending = service.cancel(exp.id, reason="cancelled by the agent")
    assert pending and asked == [exp.id]
    [reaped] = store.interrupt_running()  # the service dies before the run is recorded
    assert reaped.status is ExperimentStatus.CANCELLED and "by the agent" in (reaped.reason or "")
