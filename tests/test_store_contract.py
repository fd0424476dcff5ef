"""One contract, every store: the same suite runs against SqlStore on a real SQLite file, SqlStore
on a real PostgreSQL server (a throw-away cluster, tests/pg_server.py) and the in-memory
MemoryStore (optuna's storage tests are the model)."""

from __future__ import annotations

import math
import threading
from datetime import UTC, datetime, timedelta

import pytest
from memory_store import MemoryStore

from agent.core.config import TargetConfig
from agent.core.domain import (
    CrashKind,
    ExperimentStatus,
    Finish,
    Proposal,
    RunEnd,
    RunRole,
    RunSpec,
    RunStatus,
    SweepStatus,
)
from agent.core.errors import ConflictError, DuplicateError, NotFoundError
from agent.core.ports import Store, SweepSpec
from agent.core.record import Ending
from agent.rules.endings import finish_of, refused
from db.engine import open_database
from db.reads import Reads
from db.store import SqlStore
from runner.summary import ProgressPoint

S = ExperimentStatus
CONFIG = TargetConfig(command="python train.py", editable=("train.py",),
                      protected=("prepare.py",), metric="val_bpb", budget_s=1, timeout_s=5,
                      seed=7, min_delta=0.01)


STORES = ["sql", "postgres", "memory"]


@pytest.fixture(params=STORES)
def store(request, tmp_path) -> Store:  # type: ignore[no-untyped-def]
    return make_store(request, tmp_path)


def make_store(request, tmp_path) -> Store:  # type: ignore[no-untyped-def]
    """The store `request.param` names (other suites parametrize their own `store` with it)."""
    if request.param == "sql":
        return SqlStore(open_database(tmp_path / "c.db"))
    if request.param == "postgres":
        engine = open_database(request.getfixturevalue("pg_url"))
        request.addfinalizer(engine.dispose)
        return SqlStore(engine)
    return MemoryStore()


def reads_of(store: Store) -> Reads | None:
    """The pages' read models over a SQL store (db.reads); the memory store is the port only."""
    return Reads(store) if isinstance(store, SqlStore) else None


def points(store: Store, exp: int) -> list[ProgressPoint]:
    """An experiment's loss curve through the port (every store)."""
    return store.loss_curves([exp])[exp]


def spec(name: str = "s", **kw) -> SweepSpec:  # type: ignore[no-untyped-def]
    return SweepSpec(name=name, target_path="/t", branch=f"overnight/{name}", proposer="knobs",
                     config=CONFIG, protected_hashes={"prepare.py": "abc"}, **kw)


def running(store: Store, sweep_id: int, desc: str = "a", diff: str = "d") -> int:
    exp = store.add_experiment(sweep_id, Proposal(desc, diff))
    assert store.claim(exp.id) is not None
    return exp.id


def test_sweeps_round_trip_typed_config_and_names_are_unique(store: Store):
    deadline = datetime(2030, 1, 1, tzinfo=UTC)
    made = store.create_sweep(spec(max_experiments=3, deadline=deadline,
                                   window={"start": "22:00", "stop": "07:00"}))
    got = store.get_sweep("s")
    assert got == made and store.get_sweep_by_id(made.id) == made
    assert got.config == CONFIG and got.seed == 7 and got.min_delta == 0.01
    assert got.status is SweepStatus.RUNNING and got.deadline == deadline
    assert got.best_metric is None and got.start_at is None
    assert store.protected_hashes(made.id) == {"prepare.py": "abc"}
    with pytest.raises(ConflictError, match="already exists"):
        store.create_sweep(spec())
    store.create_sweep(spec("t"))
    assert [s.name for s in store.list_sweeps()] == ["s", "t"]
    for missing in (lambda: store.get_sweep("nope"), lambda: store.get_sweep_by_id(99),
                    lambda: store.get_experiment(99)):
        with pytest.raises(NotFoundError):
            missing()


def test_status_and_start_at(store: Store):
    store.create_sweep(spec())
    assert store.set_sweep_status("s", SweepStatus.PAUSED).status is SweepStatus.PAUSED
    when = datetime(2031, 5, 4, 3, 2, 1, tzinfo=UTC)
    assert store.set_start_at("s", when).start_at == when
    assert store.get_sweep("s").start_at == when
    assert store.set_start_at("s", None).start_at is None


def test_sweeps_listed_by_status_and_named_by_id(store: Store):
    ids = {name: store.create_sweep(spec(name)).id for name in "abcd"}
    store.set_sweep_status("b", SweepStatus.PAUSED)
    store.set_sweep_status("c", SweepStatus.DONE)
    store.set_sweep_status("d", SweepStatus.PAUSED)
    names = lambda sweeps: [s.name for s in sweeps]  # noqa: E731
    assert names(store.list_sweeps()) == ["a", "b", "c", "d"]
    assert names(store.list_sweeps([SweepStatus.RUNNING])) == ["a"]
    assert names(store.list_sweeps([SweepStatus.PAUSED, SweepStatus.DONE])) == ["b", "c", "d"]
    assert store.list_sweeps([SweepStatus.STOPPED]) == [] and store.list_sweeps([]) == []
    assert store.list_sweeps([SweepStatus.PAUSED])[0] == store.get_sweep("b")
    if (reads := reads_of(store)) is not None:
        assert reads.sweep_names([ids["d"], ids["a"], 999]) == {ids["a"]: "a", ids["d"]: "d"}
        assert reads.sweep_names([]) == {}


def test_claims_are_guarded_priority_then_fifo(store: Store):
    sweep = store.create_sweep(spec())
    a = store.add_experiment(sweep.id, Proposal("a", "d1"))
    b = store.add_experiment(sweep.id, Proposal("b", "d2"), priority=5)
    c = store.add_experiment(sweep.id, Proposal("c", "d3"))
    order = [store.claim_next(sweep.id).id for _ in range(3)]  # type: ignore[union-attr]
    assert order == [b.id, a.id, c.id]
    assert store.claim_next(sweep.id) is None
    assert store.claim(a.id) is None  # already running
    claimed = store.get_experiment(a.id)
    assert claimed.status is S.RUNNING and claimed.started_at is not None


def test_concurrent_claims_never_share_an_experiment(store: Store):
    sweep = store.create_sweep(spec())
    for i in range(40):
        store.add_experiment(sweep.id, Proposal(f"e{i}", f"diff {i}"))
    got: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        while (exp := store.claim_next(sweep.id)) is not None:
            with lock:
                got.append(exp.id)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(set(got)) and len(got) == 40


def test_finish_follows_the_transition_table_and_records_the_best(store: Store):
    sweep = store.create_sweep(spec())
    base = store.add_experiment(sweep.id, Proposal("baseline", ""), is_baseline=True)
    with pytest.raises(ConflictError, match="cannot become kept"):
        store.finish(base.id, Finish(S.KEPT, metric=1.0, best=1.0), keep_commit="abc")  # queued
    assert store.get_experiment(base.id).status is S.QUEUED  # nothing written
    store.claim(base.id)
    store.mark_started(base.id, commit="abc", pgid=4242, log_path="/l")
    done = store.finish(base.id, Finish(S.KEPT, metric=1.5, summary={"val_bpb": 1.5},
                                        best=1.5), keep_commit="abc")
    assert (done.status, done.commit, done.pgid, done.summary) == (S.KEPT, "abc", 4242,
                                                                  {"val_bpb": 1.5})
    assert done.finished_at is not None
    s = store.get_sweep("s")
    assert (s.baseline_metric, s.best_metric, s.best_commit, s.best_experiment_id) == (
        1.5, 1.5, "abc", base.id)
    second = running(store, sweep.id, "b", "d2")
    # the best written is the value the engine gives for the new best (its commit's runs in
    # their usual condition), not the change's own mean: one writer of the best's value
    store.finish(second, Finish(S.KEPT, metric=1.2, best_before=1.5, best=1.25),
                 keep_commit="def")
    s = store.get_sweep("s")
    assert (s.baseline_metric, s.best_metric, s.best_commit) == (1.5, 1.25, "def")
    assert store.get_experiment(second).metric == 1.2
    with pytest.raises(ConflictError, match="already kept"):
        store.finish(second, Finish(S.DISCARDED))
    with pytest.raises(ConflictError):
        store.mark_started(second, pgid=5)
    with pytest.raises(ValueError):
        store.finish(second, Finish(S.RUNNING))
    third = running(store, sweep.id, "c", "d3")
    with pytest.raises(ValueError, match="new best's value"):
        store.finish(third, Finish(S.KEPT, metric=1.0), keep_commit="x")
    assert store.get_experiment(third).status is S.RUNNING  # nothing written
    with pytest.raises(ValueError, match="unknown field"):
        store.mark_started(third, colour="red")


def test_a_row_born_ended_keeps_its_record_and_counts_once(store: Store):
    """A verdict reached without a run (a refusal, the crash cap) is written with the row, the
    record included, by the same rule a finish writes (agent.core.domain.born)."""
    sweep = store.create_sweep(spec())
    row = store.add_experiment(sweep.id, Proposal("r", "d"), ended=finish_of(refused("no")))
    got = store.get_experiment(row.id)
    assert (got.status, got.reason, got.finished_at is not None) == (S.REJECTED, "no", True)
    assert got.record is not None and got.record.ending is Ending.REFUSED
    assert store.count_experiments(sweep.id, [S.REJECTED]) == 1
    with pytest.raises(ValueError, match="finished status"):
        store.add_experiment(sweep.id, Proposal("q", "d2"), ended=Finish(S.QUEUED))
    assert store.count_experiments(sweep.id) == 1  # nothing written


def test_queued_may_be_cancelled_or_rejected_but_not_interrupted(store: Store):
    sweep = store.create_sweep(spec())
    a = store.add_experiment(sweep.id, Proposal("a", "d1"))
    assert store.finish(a.id, Finish(S.CANCELLED, reason="r")).status is S.CANCELLED
    b = store.add_experiment(sweep.id, Proposal("b", "d2"))
    with pytest.raises(ConflictError):
        store.finish(b.id, Finish(S.INTERRUPTED))


def test_duplicates_ignore_rejected_rows_and_whitespace(store: Store):
    sweep = store.create_sweep(spec())
    diff = "--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-LR = 1\n+LR = 2\n"
    assert store.has_diff(sweep.id, diff) is None
    store.add_experiment(sweep.id, Proposal("r", diff), ended=finish_of(refused("no")))
    assert store.has_diff(sweep.id, diff) is None
    kept = store.add_experiment(sweep.id, Proposal("q", diff))
    spaced = diff.replace("+LR = 2", "+LR = 2   ")
    assert store.has_diff(sweep.id, spaced) == store.get_experiment(kept.id)
    assert store.has_diff(sweep.id, "") is None
    other = store.create_sweep(spec("t"))
    assert store.has_diff(other.id, diff) is None


def test_one_queued_or_running_row_per_change(store: Store):
    """The duplicate check is atomic: the insert itself refuses a second active copy."""
    sweep = store.create_sweep(spec())
    diff = "--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-LR = 1\n+LR = 2\n"
    first = store.add_experiment(sweep.id, Proposal("a", diff))
    for state in ("queued", "running"):
        with pytest.raises(DuplicateError):
            store.add_experiment(sweep.id, Proposal("again", diff.replace("2\n", "2  \n")))
        if state == "queued":
            assert store.claim(first.id) is not None
    store.add_experiment(sweep.id, Proposal("r", diff), ended=finish_of(refused("dup")))
    store.add_experiment(store.create_sweep(spec("t")).id, Proposal("other sweep", diff))
    store.add_experiment(sweep.id, Proposal("baseline", ""), is_baseline=True)
    store.add_experiment(sweep.id, Proposal("baseline", ""), is_baseline=True)
    store.finish(first.id, Finish(S.DISCARDED, metric=1.0))
    again = store.add_experiment(sweep.id, Proposal("re-run on a new head", diff))
    assert again.status is S.QUEUED
    assert store.count_experiments(sweep.id, [S.QUEUED, S.RUNNING]) == 3


def test_a_requested_cancel_survives_the_process(store: Store):
    """A cancel asked of a running experiment is recorded at once: if the process dies before
    the run stops, the reaped row ends cancelled (with the reason), not interrupted."""
    sweep = store.create_sweep(spec())
    asked, other = running(store, sweep.id), running(store, sweep.id, "b", "d2")
    queued = store.add_experiment(sweep.id, Proposal("c", "d3")).id
    assert store.request_cancel(asked, "cancelled by the agent")
    assert not store.request_cancel(queued, "x")  # only a running row takes a request
    reaped = {e.id: e for e in store.interrupt_running()}
    assert reaped.keys() == {asked, other}
    assert reaped[asked].status is S.CANCELLED and store.get_experiment(asked).status is S.CANCELLED
    assert reaped[asked].reason is not None and "cancelled by the agent" in reaped[asked].reason
    assert store.get_experiment(other).status is S.INTERRUPTED
    assert store.count_experiments(sweep.id, [S.CANCELLED]) == 1
    assert not store.request_cancel(asked, "again")  # finished: nothing to record


def test_retries_are_linked_once(store: Store):
    sweep = store.create_sweep(spec())
    first = running(store, sweep.id)
    assert [e.id for e in store.interrupt_running()] == [first]
    assert store.get_experiment(first).status is S.INTERRUPTED
    assert store.retry_of(first) is None
    retry = store.add_experiment(sweep.id, Proposal("a", "d", parent_id=first), retry_of=first)
    assert retry.retry_of == first and store.retry_of(first) == retry
    with pytest.raises(ConflictError, match="already has a retry"):
        store.add_experiment(sweep.id, Proposal("a", "d"), retry_of=first)


def test_counts_and_listing_filters(store: Store):
    sweep = store.create_sweep(spec())
    other = store.create_sweep(spec("t"))
    base = store.add_experiment(sweep.id, Proposal("baseline", ""), is_baseline=True)
    store.claim(base.id)
    store.finish(base.id, Finish(S.KEPT, metric=1.0, best=1.0), keep_commit="a")
    crash = running(store, sweep.id, "c", "d1")
    store.finish(crash, Finish(S.CRASHED, CrashKind.TRIVIAL, "typo"))
    queued = store.add_experiment(sweep.id, Proposal("q", "d2")).id
    store.add_experiment(other.id, Proposal("o", "d3"))
    assert store.count_experiments() == 4
    assert store.count_experiments(sweep.id) == 3
    assert store.count_experiments(sweep.id, [S.KEPT, S.CRASHED]) == 2
    assert store.count_experiments(sweep.id, is_baseline=False) == 2
    assert store.count_experiments(crash_kind=CrashKind.TRIVIAL) == 1
    if (reads := reads_of(store)) is not None:
        assert reads.status_counts(sweep.id) == {"kept": 1, "crashed": 1, "queued": 1}
        assert reads.status_counts() == {"kept": 1, "crashed": 1, "queued": 2}
    ids = [e.id for e in store.list_experiments(sweep.id)]
    assert ids == [base.id, crash, queued]
    assert [e.id for e in store.list_experiments(sweep.id, newest_first=True, limit=2)] == [
        queued, crash]
    assert [e.id for e in store.list_experiments(sweep.id, before_id=queued)] == [base.id, crash]
    assert [e.id for e in store.list_experiments(crash_kind=CrashKind.TRIVIAL)] == [crash]
    assert [e.id for e in store.list_experiments(statuses=[S.QUEUED])] == [queued, queued + 1]


def test_briefs_and_timestamps(store: Store):
    sweep = store.create_sweep(spec())
    exp = running(store, sweep.id)
    t0 = datetime(2030, 1, 1, tzinfo=UTC)
    store.mark_started(exp, run_started_at=t0)
    store.finish(exp, Finish(S.DISCARDED, metric=2.0, log_tail="x" * 100,
                             run_ended_at=t0 + timedelta(seconds=5)))
    assert store.get_experiment(exp).log_tail == "x" * 100
    if (reads := reads_of(store)) is not None:
        brief = reads.adjacent_experiments(sweep.id, exp + 1)[0]  # the pages' brief row
        assert brief is not None and brief.id == exp and brief.log_tail is None
        assert brief.metric == 2.0
        assert reads.timestamps(sweep.id) == [(t0, t0 + timedelta(seconds=5))]


def test_loss_points_and_llm_usage(store: Store):
    sweep = store.create_sweep(spec())
    exp = running(store, sweep.id)
    store.add_loss_points(exp, [ProgressPoint(2, 3.0, 1.0), ProgressPoint(1, 4.0, 0.5)])
    store.add_loss_points(exp, [])
    assert [p.step for p in points(store, exp)] == [1, 2]
    assert points(store, exp)[0] == ProgressPoint(1, 4.0, 0.5)
    other = running(store, sweep.id, "b", "d2")  # one queued/running row per change
    store.add_loss_points(other, [ProgressPoint(7, 1.0, None)])
    store.replace_loss_points(exp, [ProgressPoint(1, 4.0, 0.5), ProgressPoint(9, 2.0, None)])
    assert [p.step for p in points(store, exp)] == [1, 9]  # a downsampled curve
    assert [p.step for p in points(store, other)] == [7]  # other runs untouched
    if (reads := reads_of(store)) is not None:
        assert reads.loss_points(exp) == points(store, exp)  # the pages read the same
    store.replace_loss_points(exp, [])
    assert points(store, exp) == []
    assert store.llm_usage(sweep.id) == (0, 0, 0.0)
    store.add_llm_usage(sweep.id, exp, 10, 5, 0.25)
    store.add_llm_usage(sweep.id, None, 1, 2, 0.5)
    assert store.llm_usage(sweep.id) == (11, 7, 0.75)
    if isinstance(store, SqlStore):
        store.ping()


def test_runs_are_records_with_a_guarded_life(store: Store):
    sweep = store.create_sweep(spec())
    exp_id = running(store, sweep.id)
    run = store.start_run(RunSpec(sweep.id, exp_id, "abc", 8, RunRole.CONFIRM, "/l.log", "cpu"))
    assert (run.status, run.seed, run.role, run.device, run.log_path) == (
        RunStatus.RUNNING, 8, RunRole.CONFIRM, "cpu", "/l.log")
    store.set_run_pgid(run.id, 4242)
    with pytest.raises(ConflictError):  # only ended ok/suspect runs may flip
        store.set_run_status(run.id, RunStatus.SUSPECT)
    ended = store.end_run(run.id, RunEnd(RunStatus.OK, 1.5, {"val_bpb": 1.5}, 100.0,
                                         "steps/s", 30.0, 35.0))
    assert (ended.pgid, ended.metric, ended.training_s, ended.total_s) == (4242, 1.5, 30.0, 35.0)
    assert ended.ended_at is not None and ended.summary == {"val_bpb": 1.5}
    assert (ended.throughput, ended.throughput_unit) == (100.0, "steps/s")
    with pytest.raises(ConflictError):  # an ended run is not ended twice
        store.end_run(run.id, RunEnd(RunStatus.FAILED))
    store.set_run_status(run.id, RunStatus.SUSPECT)
    assert store.list_runs(experiment_id=exp_id)[0].status is RunStatus.SUSPECT
    with pytest.raises(ConflictError):
        store.set_run_status(run.id, RunStatus.FAILED)
    with pytest.raises(NotFoundError):
        store.start_run(RunSpec(sweep.id, 999, "abc", 7, RunRole.SCREEN))
    with pytest.raises(NotFoundError):
        store.set_run_pgid(999, 1)
    other = store.start_run(RunSpec(sweep.id, exp_id, "abc", 9, RunRole.CONFIRM))
    assert [r.id for r in store.list_runs(sweep_id=sweep.id)] == [run.id, other.id]
    assert store.list_runs(sweep_id=sweep.id + 1) == []
    assert [r.id for r in store.interrupt_running_runs()] == [other.id]
    assert store.list_runs(sweep_id=sweep.id)[-1].status is RunStatus.INTERRUPTED
    assert store.interrupt_running_runs() == []
    # what the keep rule reads: every run of the sweep, oldest first, the same facts
    assert [(r.experiment_id, r.commit, r.role, r.status, r.metric, r.throughput)
            for r in store.run_metrics(sweep.id)] == [
        (exp_id, "abc", RunRole.CONFIRM, RunStatus.SUSPECT, 1.5, 100.0),
        (exp_id, "abc", RunRole.CONFIRM, RunStatus.INTERRUPTED, None, None)]
    assert store.run_metrics(sweep.id + 1) == []


def test_a_runs_slurm_job_is_recorded_and_survives_its_end_and_reaping(store: Store):
    sweep = store.create_sweep(spec())
    exp_id = running(store, sweep.id)
    run = store.start_run(RunSpec(sweep.id, exp_id, "abc", 1, RunRole.SCREEN))
    assert run.slurm_job_id is None
    store.set_run_job(run.id, "4711")
    ended = store.end_run(run.id, RunEnd(RunStatus.OK, 1.0))
    assert ended.slurm_job_id == "4711"
    adopted = store.start_run(RunSpec(sweep.id, exp_id, "abc", 2, RunRole.CONFIRM))
    store.set_run_job(adopted.id, "4712_3")  # an array task's id is text
    assert [r.slurm_job_id for r in store.interrupt_running_runs()] == ["4712_3"]
    assert [r.slurm_job_id for r in store.list_runs(experiment_id=exp_id)] == ["4711", "4712_3"]
    with pytest.raises(NotFoundError):
        store.set_run_job(999, "1")


def test_runs_record_their_speeds_source_their_pair_and_the_rules_note(store: Store):
    sweep = store.create_sweep(spec())
    exp_id = running(store, sweep.id)
    change = store.start_run(RunSpec(sweep.id, exp_id, "abc", 42, RunRole.SCREEN, device="cuda:1"))
    store.end_run(change.id, RunEnd(RunStatus.OK, 1.5, {}, 80.0, "steps/s",
                                    throughput_source="progress: elapsed"))
    beside = store.start_run(RunSpec(sweep.id, exp_id, "def", 42, RunRole.INCUMBENT,
                                     device="cuda:1", pair_run_id=change.id))
    assert beside.pair_run_id == change.id
    ended = store.end_run(beside.id, RunEnd(RunStatus.OK, 1.6, {}, 81.0, "steps/s",
                                            throughput_source="progress: elapsed"))
    assert (ended.throughput_source, ended.pair_run_id, ended.note) == (
        "progress: elapsed", change.id, None)
    store.set_run_status(change.id, RunStatus.SUSPECT, "80/s, -31% vs the incumbent's 116/s")
    store.set_run_status(change.id, RunStatus.SUSPECT)  # no note given: the note stays
    got = {r.id: r for r in store.run_metrics(sweep.id)}
    assert (got[change.id].status, got[change.id].note, got[change.id].device) == (
        RunStatus.SUSPECT, "80/s, -31% vs the incumbent's 116/s", "cuda:1")
    assert (got[beside.id].pair_run_id, got[beside.id].throughput_source) == (
        change.id, "progress: elapsed")
    store.set_run_status(change.id, RunStatus.OK, "")  # an empty note clears it
    (full,) = [r for r in store.list_runs(sweep_id=sweep.id) if r.id == change.id]
    assert (full.status, full.note, full.throughput_source) == (
        RunStatus.OK, None, "progress: elapsed")
    with pytest.raises(ConflictError):  # a note rides on the ok/suspect flip only
        store.set_run_status(change.id, RunStatus.FAILED, "nope")


def test_finish_keeps_contract_warnings_in_meta(store: Store):
    sweep = store.create_sweep(spec())
    exp_id = running(store, sweep.id)
    done = store.finish(exp_id, Finish(S.DISCARDED, metric=1.0, warnings=("over budget",)))
    assert done.meta["warnings"] == ["over budget"]
    assert store.get_experiment(exp_id).meta["warnings"] == ["over budget"]


def test_gc_finds_old_finished_rows_and_prunes_a_batch_in_place(store: Store):
    """`prunable_experiments` filters by status (finished only), age, never-pruned and id;
    `loss_curves` and `run_log_paths` read a batch's curves and run logs; `prune_experiments`
    thins the curves and forgets the log files of the whole batch, or of none of it."""
    sweep = store.create_sweep(spec())
    done = running(store, sweep.id, "a", "da")
    store.mark_started(done, log_path="/w/logs/s/1.log", commit="c1", ref="refs/overnight/s/1")
    store.add_loss_points(done, [ProgressPoint(i, 5.0 - i, None) for i in range(5)])
    run = store.start_run(RunSpec(sweep.id, done, "c1", 1, RunRole.SCREEN, "/w/logs/s/1.log"))
    store.end_run(run.id, RunEnd(RunStatus.OK, metric=1.0))
    again = store.start_run(RunSpec(sweep.id, done, "c1", 2, RunRole.CONFIRM, "/w/logs/s/1b.log"))
    store.end_run(again.id, RunEnd(RunStatus.OK, metric=1.1))
    store.finish(done, Finish(S.DISCARDED, metric=1.5, summary={"val_bpb": 1.5},
                              log_tail="last lines"))
    other = running(store, sweep.id, "o", "do")
    store.add_loss_points(other, [ProgressPoint(1, 2.0, 0.5)])
    store.finish(other, Finish(S.CRASHED, CrashKind.FUNDAMENTAL, reason="boom"))
    busy = running(store, sweep.id, "b", "db")
    queued = store.add_experiment(sweep.id, Proposal("c", "dc")).id
    later = datetime.now(UTC) + timedelta(seconds=5)
    everything = list(S)
    assert [e.id for e in store.prunable_experiments(later, everything, 10)] == [done, other]
    assert [e.id for e in store.prunable_experiments(later, everything, 1)] == [done]
    assert store.prunable_experiments(later, [S.KEPT, S.RUNNING, S.QUEUED], 10) == []
    assert store.prunable_experiments(datetime.now(UTC) - timedelta(days=1), everything,
                                      10) == []
    assert [e.id for e in store.prunable_experiments(later, everything, 10,
                                                     after_id=done)] == [other]
    curves = store.loss_curves([done, other, queued])
    assert curves == {done: curves[done], other: [ProgressPoint(1, 2.0, 0.5)],
                      queued: []} and len(curves[done]) == 5
    if (reads := reads_of(store)) is not None:
        assert reads.loss_points(done) == curves[done]
    assert store.loss_curves([]) == {} and store.run_log_paths([]) == {}
    assert store.run_log_paths([done, other, 999]) == {
        done: ["/w/logs/s/1.log", "/w/logs/s/1b.log"]}
    before = store.get_experiment(done)
    for bad in (busy, queued, 999):  # one bad row: nothing of the batch is pruned
        with pytest.raises(NotFoundError if bad == 999 else ConflictError):
            store.prune_experiments({done: ([], {}), bad: ([], {})})
        assert store.get_experiment(done) == before and len(points(store, done)) == 5
    store.prune_experiments({done: ([ProgressPoint(4, 1.0, None)], {"log_files": 1}),
                             other: ([], {"log_files": 0})})
    pruned = store.get_experiment(done)
    assert pruned.pruned_at is not None and pruned.log_path is None
    assert pruned.meta["pruned"] == {"log_files": 1}
    assert store.get_experiment(other).meta["pruned"] == {"log_files": 0}
    for kept_field in ("diff", "metric", "summary", "log_tail", "commit", "ref", "status",
                       "finished_at", "description"):
        assert getattr(pruned, kept_field) == getattr(before, kept_field), kept_field
    assert points(store, done) == [ProgressPoint(4, 1.0, None)]
    assert points(store, other) == []
    assert [r.log_path for r in store.list_runs(experiment_id=done)] == [None, None]
    assert store.prunable_experiments(later, everything, 10) == []  # pruned once only
    assert store.get_experiment(busy).status is S.RUNNING
    store.prune_experiments({})  # nothing to do


def test_a_diverged_run_and_binary_output_are_recorded(store: Store):
    """NaN and infinity in a summary (a diverged run) and a NUL byte in the log tail (binary
    output) are recorded, not a database error that leaves the experiment running."""
    sweep = store.create_sweep(spec())
    exp_id = running(store, sweep.id)
    summary = {"val_bpb": float("nan"), "grad_norm": float("inf"), "note": "diverged"}
    store.finish(exp_id, Finish(S.CRASHED, crash_kind=CrashKind.FUNDAMENTAL,
                                summary=summary,
                                metric=float("nan"), log_tail="loss nan\x00\x01 step 3",
                                reason="val\x00bpb"))
    got = store.get_experiment(exp_id)
    assert got.status is S.CRASHED and math.isnan(got.summary["val_bpb"])
    assert got.summary["grad_norm"] == float("inf") and got.summary["note"] == "diverged"
    assert got.metric is None or math.isnan(got.metric)  # SQLite stores a NaN REAL as NULL
    assert got.log_tail is not None and got.log_tail.startswith("loss nan")
    assert got.log_tail.endswith("\x01 step 3") and got.reason is not None
    if (reads := reads_of(store)) is not None:
        brief = reads.adjacent_experiments(sweep.id, exp_id + 1)[0]
        assert brief is not None and math.isnan(brief.summary["val_bpb"])


def test_ids_past_32_bits_are_simply_not_found(store: Store):
    """The API takes ids up to 2^63 - 1 (SQLite's INTEGER); every store answers 'not found',
    never a database error (PostgreSQL's ids are bigint for this)."""
    sweep = store.create_sweep(spec())
    exp_id = running(store, sweep.id)
    for huge in (2**31, 2**63 - 1):
        with pytest.raises(NotFoundError):
            store.get_experiment(huge)
        assert store.retry_of(huge) is None
    assert [e.id for e in store.list_experiments(before_id=2**63 - 1)] == [exp_id]
    assert store.list_experiments(sweep_id=2**40) == []


def test_reads_in_one_transaction_see_what_single_reads_see(store: Store):
    """`reading()`: the same answers inside as outside; nested blocks are one; a refusal inside
    leaves the store as it was."""
    sweep = store.create_sweep(spec())
    added = store.add_experiment(sweep.id, Proposal("a", "d1", meta={"k": 1}), priority=3)
    assert added == store.get_experiment(added.id)  # the insert returns the row as stored
    with store.reading():
        inside = (store.get_sweep("s"), store.list_experiments(sweep.id),
                  store.count_experiments(sweep.id), store.has_diff(sweep.id, "d1"))
        with store.reading():
            assert store.get_experiment(added.id) == added
    assert inside == (store.get_sweep("s"), [added], 1, added)
    with pytest.raises(NotFoundError), store.reading():
        store.get_sweep("s")
        store.get_sweep("nope")
    assert store.get_sweep("s") == sweep and store.count_experiments(sweep.id) == 1


@pytest.mark.parametrize("backend", ["sql", "postgres"])
def test_the_blocking_migration_keeps_old_runs_unknown(request, tmp_path, backend):
    """run_blocking adds throughput_source, pair_run_id and note; runs already there read
    them as unknown (NULL) and take the keep rule's note afterwards."""
    from sqlalchemy import text

    from db.engine import make_engine, migrate

    url = tmp_path / "old.db" if backend == "sql" else request.getfixturevalue("pg_url")
    engine = make_engine(url)
    request.addfinalizer(engine.dispose)
    migrate(engine, "experiment_cancel_reason")  # the revision before run_blocking
    store = SqlStore(engine)
    sweep = store.create_sweep(spec())
    exp_id = running(store, sweep.id)
    with store.session("an old release's run") as s:
        s.execute(text(
            "INSERT INTO runs (sweep_id, experiment_id, \"commit\", seed, role, status, metric, "
            "summary, throughput, started_at) VALUES (:s, :e, 'c', 42, 'screen', 'ok', 1.5, "
            "'{}', 100.0, '2026-11-29 00:00:00')"), {"s": sweep.id, "e": exp_id})
    migrate(engine)
    (old,) = store.run_metrics(sweep.id)
    assert (old.throughput, old.throughput_source, old.pair_run_id, old.note) == (
        100.0, None, None, None)
    store.set_run_status(old.id, RunStatus.SUSPECT, "off the incumbent's speed")
    assert store.list_runs(sweep_id=sweep.id)[0].note == "off the incumbent's speed"


@pytest.mark.parametrize("backend", ["sql", "postgres"])
def test_the_holdout_migration_keeps_old_runs_unsealed(request, tmp_path, backend):
    """holdout_confirm adds runs.holdout: runs already there read it as NULL; a run ended with
    a holdout value keeps it, outside its summary."""
    from sqlalchemy import text

    from agent.core.domain import RunEnd, RunRole, RunSpec
    from db.engine import make_engine, migrate

    url = tmp_path / "old.db" if backend == "sql" else request.getfixturevalue("pg_url")
    engine = make_engine(url)
    request.addfinalizer(engine.dispose)
    migrate(engine, "run_blocking")  # the revision before holdout_confirm
    store = SqlStore(engine)
    sweep = store.create_sweep(spec())
    exp_id = running(store, sweep.id)
    with store.session("an old release's run") as s:
        s.execute(text(
            "INSERT INTO runs (sweep_id, experiment_id, \"commit\", seed, role, status, metric, "
            "summary, started_at) VALUES (:s, :e, 'c', 42, 'screen', 'ok', 1.5, '{}', "
            "'2026-11-29 00:00:00')"), {"s": sweep.id, "e": exp_id})
    migrate(engine)
    (old,) = store.list_runs(sweep_id=sweep.id)
    assert old.holdout is None
    new = store.start_run(RunSpec(sweep.id, exp_id, "c", 43, RunRole.CONFIRM))
    store.end_run(new.id, RunEnd(RunStatus.OK, metric=1.4, summary={"val_bpb": 1.4},
                                 holdout=1.47))
    got = store.list_runs(sweep_id=sweep.id)[-1]
    assert (got.holdout, got.summary) == (1.47, {"val_bpb": 1.4})
