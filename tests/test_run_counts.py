"""The maintained run counts (table run_counts, db/counts.py bump_runs) behind
Store.sweep_version: after every kind of run write they equal a count over the runs, on SQLite
and PostgreSQL; the version reads no run but each status's highest id (one index seek); the
migration fills the table from the runs already there; bulk loads rebuild it."""

from __future__ import annotations

from pathlib import Path

import pytest
from bulk_seed import seed
from sqlalchemy import text
from test_query_plans import captured, plan
from test_store_contract import make_store, spec

from agent.core.domain import ExperimentStatus as S
from agent.core.domain import Finish, Proposal, RunEnd, RunRole, RunSpec, RunStatus
from agent.core.ports import Store
from db.engine import make_engine, migrate, open_database
from db.reads import Reads
from db.store import SqlStore


@pytest.fixture(params=["sql", "postgres"])
def store(request, tmp_path) -> Store:  # type: ignore[no-untyped-def]
    return make_store(request, tmp_path)


def counted(store: SqlStore, sweep_id: int) -> tuple[tuple[str, int, int], ...]:
    """The runs part of sweep_version as a count over the runs (what it was before)."""
    with store.session("counting runs") as s:
        rows = s.execute(text(
            "SELECT status, COUNT(*), MAX(id) FROM runs WHERE sweep_id = :s AND status != "
            "'running' GROUP BY status ORDER BY status"), {"s": sweep_id}).all()
    return tuple(map(tuple, rows))


def table(store: SqlStore) -> dict[tuple[int, str], int]:
    with store.session("reading run counts") as s:
        return {(sid, st): n for sid, st, n in
                s.execute(text("SELECT sweep_id, status, n FROM run_counts")) if n}


def truth(store: SqlStore) -> dict[tuple[int, str], int]:
    with store.session("counting runs") as s:
        return {(sid, st): n for sid, st, n in s.execute(text(
            "SELECT sweep_id, status, COUNT(*) FROM runs GROUP BY sweep_id, status"))}


def test_every_run_write_keeps_the_counts(store: SqlStore) -> None:
    sids = [store.create_sweep(spec(f"s{i}")).id for i in range(2)]
    runs = []
    for i in range(6):
        sid = sids[i % 2]
        e = store.add_experiment(sid, Proposal(f"e{i}", f"d{i}"))
        store.claim(e.id)
        runs.append(store.start_run(RunSpec(sid, e.id, f"c{i}", 42, RunRole.SCREEN)))
        assert table(store) == truth(store)
        if i < 4:
            end = RunEnd(RunStatus.OK if i % 3 else RunStatus.FAILED, metric=1.0 + i)
            store.end_run(runs[-1].id, end)
            store.finish(e.id, Finish(S.DISCARDED, metric=1.0 + i, best_before=1.0))
        assert table(store) == truth(store)
        assert Reads(store).sweep_version(sid)[1] == counted(store, sid)
    store.set_run_status(runs[1].id, RunStatus.SUSPECT)  # a verdict flips, and back
    assert table(store) == truth(store) and Reads(store).sweep_version(sids[1])[1] == counted(
        store, sids[1])
    store.set_run_status(runs[1].id, RunStatus.OK)
    assert table(store) == truth(store)
    reaped = store.interrupt_running_runs()  # a dead process's runs, in both sweeps
    assert len(reaped) == 2 and table(store) == truth(store)
    for sid in sids:
        assert Reads(store).sweep_version(sid)[1] == counted(store, sid)


def test_the_version_seeks_instead_of_counting_runs(tmp_path: Path) -> None:
    db = tmp_path / "v.db"
    store = SqlStore(open_database(db))
    sid = store.create_sweep(spec()).id
    seed(db, sid, 300, runs=True)
    assert table(store) == truth(store)  # the bulk load rebuilt them
    with captured() as seen:
        version = Reads(store).sweep_version(sid)[1]
    assert version == counted(store, sid) and version
    on_runs = [(sql, p) for sql, p in seen if "FROM runs" in sql]
    assert on_runs
    for sql, params in on_runs:
        lines = plan(db, sql, params)
        assert not any(line.startswith("SCAN runs") for line in lines), lines
        assert any("ix_runs_sweep_status" in line for line in lines), lines


def test_the_migration_counts_the_runs_already_there(tmp_path: Path) -> None:
    engine = make_engine(tmp_path / "old.db")
    migrate(engine, "created_index")  # the revision before run_counts
    store = SqlStore(engine)
    sid = store.create_sweep(spec()).id
    for i in range(3):
        e = store.add_experiment(sid, Proposal(f"e{i}", f"d{i}"))
        with store.session("an old release's run") as s:
            s.execute(text(
                "INSERT INTO runs (sweep_id, experiment_id, \"commit\", seed, role, status, "
                "summary, started_at) VALUES (:s, :e, 'c', 42, 'screen', :st, '{}', "
                "'2026-11-29 00:00:00')"), {"s": sid, "e": e.id, "st": ["ok", "failed", "ok"][i]})
    migrate(engine)
    assert table(store) == truth(store) == {(sid, "ok"): 2, (sid, "failed"): 1}
    assert Reads(store).sweep_version(sid)[1] == counted(store, sid)
    engine.dispose()
