"""A run whose remote worker went away (WorkerLostError from the Runner port): the experiment is
`interrupted`, its run too, and it is re-queued exactly once per loss, up to the crash limit.

The lost machine is the one fake here (a Runner that raises as the Ray runner does when a node
dies); git, the store and the loop are real. tests/test_ray_executor.py loses a real node.
"""

from __future__ import annotations

from pathlib import Path

from service_fixtures import knob_diff, make_counting_target

from agent.core.domain import ExperimentStatus, Proposal, RunStatus
from agent.core.errors import WorkerLostError
from agent.engine.loop import Loop, LoopSettings
from agent.engine.recovery import RecoveryReport, requeue_interrupted
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo
from agent.ops.sweeps import create_sweep
from agent.rules.endings import GAVE_UP_CAUSE, MAX_CRASH_RETRIES
from db.engine import open_database
from db.store import SqlStore


class LostNode(SubprocessRunner):
    """Runs the baseline for real; every later run's node dies before it reports."""

    def run(self, argv, **kw):  # type: ignore[no-untyped-def,override]
        if kw["env"].get("OVERNIGHT_EXPERIMENT_ID") == "1":
            return super().run(argv, **kw)
        raise WorkerLostError("NodeDiedError: the node running it is dead")


def test_a_lost_worker_interrupts_and_requeues_once_per_loss(tmp_path: Path):
    target = make_counting_target(tmp_path / "target", n_knobs=2)
    store = SqlStore(open_database(tmp_path / "o.db"))
    repo = GitRepo(target)
    sweep = create_sweep(store, repo, target, name="s", proposer="queue")
    loop = Loop(store, repo, LostNode(grace_s=0.5), LoopSettings(work_dir=tmp_path / "work"))
    assert loop.execute(sweep, store.claim_next(sweep.id)).status is ExperimentStatus.KEPT
    store.add_experiment(sweep.id, Proposal("k1", knob_diff(target, 1, 1)))
    lost = []
    while (exp := store.claim_next(sweep.id)) is not None:
        done = loop.execute(sweep, exp)
        assert done.status is ExperimentStatus.INTERRUPTED
        assert done.reason and "worker running it was lost: NodeDiedError" in done.reason
        assert [r.status for r in store.list_runs(experiment_id=exp.id)] == [
            RunStatus.INTERRUPTED]
        lost.append(done)
    # each loss queued one retry, linked to it; past the crash limit the chain ends in a verdict
    assert len(lost) == MAX_CRASH_RETRIES + 1
    for earlier, later in zip(lost, lost[1:], strict=False):
        assert later.retry_of == earlier.id
    verdict = store.retry_of(lost[-1].id)
    assert verdict is not None and verdict.status is ExperimentStatus.CRASHED
    assert verdict.reason is not None and verdict.reason.startswith(GAVE_UP_CAUSE)
    assert verdict.record is not None and verdict.record.ending.value == "gave up"
    # a restart's recovery queues nothing more: each interrupted row has its follow-up already
    report = RecoveryReport()
    requeue_interrupted(store, report)
    assert report.requeued == {} and report.not_requeued == []
    assert not list(tmp_path.joinpath("work", "worktrees", "s").iterdir())
