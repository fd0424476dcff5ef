"""The SQLite store contract: guarded claims, read-only finished records, one readable error."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import inspect, text

from agent.config import TargetConfig
from agent.domain import ExperimentStatus, Finish, Proposal
from agent.errors import ConflictError, NotFoundError
from agent.ports import SweepSpec
from db.engine import open_database
from db.store import SqlStore


def spec(name="s"):
    return SweepSpec(
        name=name,
        target_path="/t",
        branch=f"overnight/{name}",
        proposer="knobs",
        config=TargetConfig("python train.py", ("train.py",), (), "val_bpb", budget_s=1,
                            timeout_s=5),
    )


def test_schema_is_migrated_with_wal(tmp_path):
    engine = open_database(tmp_path / "x.db")
    assert {"sweeps", "experiments", "loss_points", "alembic_version"} <= set(
        inspect(engine).get_table_names()
    )
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert (
            conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0001"
            or conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        )
    open_database(tmp_path / "x.db")  # a second open is a no-op


def test_duplicate_sweep_name_is_a_conflict(store: SqlStore):
    store.create_sweep(spec())
    with pytest.raises(ConflictError, match="already exists"):
        store.create_sweep(spec())
    with pytest.raises(NotFoundError):
        store.get_sweep("nope")


def test_claim_is_guarded_and_fifo_within_priority(store: SqlStore):
    sweep = store.create_sweep(spec())
    a = store.add_experiment(sweep.id, Proposal("a", "d1"))
    b = store.add_experiment(sweep.id, Proposal("b", "d2"), priority=5)
    c = store.add_experiment(sweep.id, Proposal("c", "d3"))
    order = [store.claim_next(sweep.id).id for _ in range(3)]
    assert order == [b.id, a.id, c.id]
    assert store.claim_next(sweep.id) is None
    assert store.claim(a.id) is None  # already running


def test_concurrent_claims_never_share_an_experiment(store: SqlStore):
    sweep = store.create_sweep(spec())
    for i in range(40):
        store.add_experiment(sweep.id, Proposal(f"e{i}", f"diff {i}"))
    got: list[int] = []
    lock = threading.Lock()

    def worker():
        while (exp := store.claim_next(sweep.id)) is not None:
            with lock:
                got.append(exp.id)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(set(got)) and len(got) == 40


def test_finished_records_are_read_only(store: SqlStore):
    sweep = store.create_sweep(spec())
    exp = store.add_experiment(sweep.id, Proposal("a", "d"))
    store.claim(exp.id)
    done = store.finish(exp.id, Finish(ExperimentStatus.KEPT, metric=1.0), keep_commit="abc")
    assert done.status is ExperimentStatus.KEPT and done.commit == "abc"
    assert store.get_sweep("s").best_metric == 1.0
    with pytest.raises(ConflictError, match="already kept"):
        store.finish(exp.id, Finish(ExperimentStatus.DISCARDED))
    with pytest.raises(ConflictError):
        store.mark_started(exp.id, pgid=5)
    with pytest.raises(ValueError):
        store.finish(exp.id, Finish(ExperimentStatus.RUNNING))


def test_interrupt_running_marks_only_running(store: SqlStore):
    sweep = store.create_sweep(spec())
    running = store.add_experiment(sweep.id, Proposal("a", "d"))
    queued = store.add_experiment(sweep.id, Proposal("b", "e"))
    store.claim(running.id)
    reaped = store.interrupt_running()
    assert [e.id for e in reaped] == [running.id]
    assert store.get_experiment(running.id).status is ExperimentStatus.INTERRUPTED
    assert store.get_experiment(queued.id).status is ExperimentStatus.QUEUED


def test_timestamps_are_aware_utc(store: SqlStore):
    sweep = store.create_sweep(spec())
    exp = store.add_experiment(sweep.id, Proposal("a", "d"))
    assert store.get_experiment(exp.id).created_at.tzinfo is not None
    assert store.get_sweep("s").created_at.utcoffset().total_seconds() == 0
