"""PostgreSQL as the database, on a real throw-away server (tests/pg_server.py): the migrations
from an empty database, claims by concurrent threads and processes, the advisory instance lock
held and released by real processes. The store contract runs on it in test_store_contract.py;
the CLI, the service and kill -9 recovery in test_postgres_service.py."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text

from agent.core.config import TargetConfig
from agent.core.domain import Proposal
from agent.core.ports import SweepSpec
from agent.engine.recovery import InstanceLockError
from db.engine import make_engine, open_database
from db.location import DbLocation
from db.lock import AdvisoryLock, instance_lock
from db.reads import Reads
from db.store import SqlStore

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).parent / "scripts"
CONFIG = TargetConfig(command="python train.py", editable=("train.py",), metric="val_bpb",
                      budget_s=1, timeout_s=5)


def _sweep(store: SqlStore, name: str) -> int:
    return store.create_sweep(SweepSpec(name=name, target_path="/t", branch=f"overnight/{name}",
                                        proposer="queue", config=CONFIG)).id


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path: Path) -> str:  # type: ignore[no-untyped-def]
    """A migrated database of each kind, as the text a user gives to --db."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    path = tmp_path / "o.db"
    open_database(path).dispose()
    return str(path)


def test_migrations_build_an_empty_database_once_under_a_race(pg_cluster) -> None:  # type: ignore
    url = pg_cluster.create_database("fresh", template=None)
    errors: list[BaseException] = []

    def migrate() -> None:
        try:
            open_database(url).dispose()
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    engine = open_database(url)  # and once more on an up-to-date schema: a no-op
    try:
        with engine.connect() as conn:
            head = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
            index = conn.execute(text("SELECT indexdef FROM pg_indexes "
                                      "WHERE indexname = 'ux_experiments_active_diff'")).scalar()
            summary = conn.execute(text(
                "SELECT data_type FROM information_schema.columns "
                "WHERE table_name = 'experiments' AND column_name = 'summary'")).scalar()
            id_type = conn.execute(text(
                "SELECT data_type FROM information_schema.columns "
                "WHERE table_name = 'experiments' AND column_name = 'id'")).scalar()
        assert head == [ScriptDirectory(str(ROOT / "db" / "migrations")).get_current_head()]
        # partial: finished rows keep their history, only queued/running copies are refused
        assert index is not None and "WHERE" in index and "queued" in index, index
        assert summary == "text"  # JSON as text: NaN and Infinity round-trip
        assert id_type == "bigint"  # 64-bit ids like SQLite's INTEGER
    finally:
        engine.dispose()


def test_a_url_without_a_server_is_one_readable_error(tmp_path: Path) -> None:
    from pg_server import free_port

    pytest.importorskip("psycopg")
    url = f"postgresql://nobody@127.0.0.1:{free_port()}/nothing"
    with pytest.raises(Exception, match="connect|refused") as info:
        open_database(url)
    assert "127.0.0.1" in str(info.value)
    with pytest.raises(InstanceLockError, match="cannot reach"):
        AdvisoryLock(DbLocation.parse(url)).acquire()


def test_threads_claiming_with_skip_locked_never_share_a_row(pg_url: str) -> None:
    store = SqlStore(open_database(pg_url))
    try:
        sweeps = [_sweep(store, f"s{i}") for i in range(3)]
        for k in range(90):
            store.add_experiment(sweeps[k % 3], Proposal(f"e{k}", f"diff {k}"),
                                 priority=k % 4)
        won: list[int] = []
        lock = threading.Lock()

        def worker(sweep_id: int | None) -> None:
            while (exp := store.claim_next(sweep_id)) is not None:
                with lock:
                    won.append(exp.id)

        threads = [threading.Thread(target=worker, args=(sweeps[i % 3] if i % 2 else None,))
                   for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 90 and len(set(won)) == 90
        assert Reads(store).status_counts() == {"running": 90}
    finally:
        store.engine.dispose()


def test_processes_claiming_at_once_never_share_a_row(db: str, tmp_path: Path) -> None:
    """Six real processes (three take the next row, three claim ids in shuffled order) start
    on one signal; every experiment is won by exactly one of them."""
    engine = make_engine(db)
    store = SqlStore(engine)
    sweep_id = _sweep(store, "race")
    ids = [store.add_experiment(sweep_id, Proposal(f"e{k}", f"diff {k}")).id for k in range(120)]
    engine.dispose()
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rng = random.Random(5)
    procs = []
    for i in range(6):
        order = [str(x) for x in rng.sample(ids, len(ids))] if i % 2 else []
        argv = [sys.executable, str(SCRIPTS / "claimer.py"), db, str(go),
                "ids" if i % 2 else "next", *order]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env, cwd=ROOT))
    for p in procs:  # each prints "ready" once connected
        assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr
    go.touch()
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    won = [int(line) for out, _ in outputs for line in out.split()]
    assert sorted(won) == sorted(ids), "an experiment was claimed twice or never"


def _hold_lock_in_child(url: str) -> subprocess.Popen[str]:
    code = ("import sys, time; from db.location import DbLocation; "
            "from db.lock import AdvisoryLock; "
            "AdvisoryLock(DbLocation.parse(sys.argv[1])).acquire(); "
            "print('held', flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE,
                             text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_the_advisory_lock_refuses_a_second_process_until_the_first_dies(pg_url: str) -> None:
    location = DbLocation.parse(pg_url)
    child = _hold_lock_in_child(pg_url)
    try:
        with pytest.raises(InstanceLockError, match="already using this database") as info:
            instance_lock(location)  # waits its few seconds, then refuses
        assert f"overnight pid {child.pid}" in str(info.value)  # names the holder
        with pytest.raises(InstanceLockError, match="already using this database"):
            AdvisoryLock(location, wait_s=0).acquire()  # no wait at all
        other = open_database(pg_url)  # the data stays readable meanwhile
        assert SqlStore(other).list_sweeps() == []
        other.dispose()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    # The server ends the dead holder's session when it sees the socket close; the waiting
    # acquire (a restart right after a crash) gets the lock then, without polling.
    lock = AdvisoryLock(location, wait_s=60).acquire()
    assert lock.held
    with pytest.raises(InstanceLockError):
        AdvisoryLock(location, wait_s=0).acquire()
    lock.release()
    assert not lock.held
    again = AdvisoryLock(location, wait_s=0).acquire()  # released: free at once
    again.release()


def test_the_lock_is_per_database(pg_cluster) -> None:  # type: ignore[no-untyped-def]
    one = instance_lock(DbLocation.parse(pg_cluster.create_database()))
    two = instance_lock(DbLocation.parse(pg_cluster.create_database()))
    assert one.held and two.held
    one.release()
    two.release()


def test_an_old_postgresql_database_is_upgraded_with_its_rows(pg_cluster) -> None:  # type: ignore
    """Revision 0001 with rows, then every later migration's PostgreSQL branch: retry_of from
    the metadata, the race's queued copies rejected before the partial index, runs
    backfilled from the (text) JSON, nothing lost."""
    from agent.core.domain import RunRole, RunStatus
    from agent.core.errors import DuplicateError
    from db.engine import migrate
    from db.store import diff_key

    engine = make_engine(pg_cluster.create_database("old", template=None))
    migrate(engine, "0001")  # the schema as that release left it
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO sweeps (id, name, target_path, branch, status, proposer, config, "
            "protected_hashes, seed, min_delta, llm_tokens_in, llm_tokens_out, llm_usd, "
            "created_at, updated_at) VALUES (1, 's', '/t', 'overnight/s', 'running', 'queue', "
            "'{\"seed\": 7}', '{}', 7, 0, 0, 0, 0, '2026-11-29', '2026-11-29')"))
        rows = [  # id, baseline, status, commit, summary, meta, diff
            (1, True, "kept", "aaa", '{"val_bpb": 1.5, "training_seconds": 30.0}', "{}", ""),
            (2, False, "interrupted", "bbb", '{"val_bpb": NaN}', "{}", "d2"),
            (3, False, "queued", None, "{}", '{"retry_of": 2}', "d3"),
            (4, False, "queued", None, "{}", "{}", "same"),
            (5, False, "queued", None, "{}", "{}", "same"),
        ]
        for i, base, status, commit, summary, meta, diff in rows:
            conn.execute(text(
                "INSERT INTO experiments (id, sweep_id, attempt, is_baseline, priority, "
                "proposer, description, diff, diff_key, status, \"commit\", summary, meta, "
                "llm_tokens_in, llm_tokens_out, llm_usd, created_at, run_started_at) VALUES "
                "(:i, 1, 0, :b, 0, 'q', 'd', :diff, :key, :st, :c, :sm, :m, 0, 0, 0, "
                "'2026-11-29', :started)"),
                {"i": i, "b": base, "diff": diff, "key": diff_key(diff), "st": status,
                 "c": commit, "sm": summary, "m": meta,
                 "started": "2026-11-29 01:00" if commit else None})
        for table in ("sweeps", "experiments"):  # explicit ids: move the sequences past them
            conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                              f"(SELECT MAX(id) FROM {table}))"))
    migrate(engine)
    store = SqlStore(engine)
    try:
        assert [(e.id, e.status.value) for e in store.list_experiments(1)] == [
            (1, "kept"), (2, "interrupted"), (3, "queued"), (4, "queued"), (5, "rejected")]
        assert "duplicate of experiment 4" in (store.get_experiment(5).reason or "")
        assert store.retry_of(2) is not None and store.retry_of(2).id == 3  # type: ignore
        runs = store.list_runs(sweep_id=1)
        assert [(r.experiment_id, r.role, r.status, r.seed) for r in runs] == [
            (1, RunRole.BASELINE, RunStatus.OK, 7), (2, RunRole.SCREEN, RunStatus.INTERRUPTED, 7)]
        assert runs[0].training_s == 30.0
        with pytest.raises(DuplicateError):
            store.add_experiment(1, Proposal("again", "same"))
        assert store.add_experiment(1, Proposal("new", "d6")).id > 5  # past the old ids
        migrate(engine)  # idempotent
        assert len(store.list_runs()) == 2
    finally:
        engine.dispose()


def test_a_lock_whose_session_is_cut_is_taken_again(tmp_path: Path) -> None:
    """The server restarts under a held lock: the holder's watch takes it again on a new
    session, so a second process is still refused afterwards. (Its own cluster: restarting
    the shared one would cut every other test's connections.)"""
    import pg_server

    reason = pg_server.why_unavailable()
    if reason is not None:
        if os.environ.get(pg_server.REQUIRE_ENV) == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    from service_fixtures import wait_for

    cluster = pg_server.start_cluster()
    try:
        cluster.execute("CREATE DATABASE cut")
        location = DbLocation.parse(cluster.url("cut"))
        lock = AdvisoryLock(location, check_s=0.1).acquire()
        cluster.restart()  # every session ends, the lock's too

        def refused_again() -> bool:
            try:
                probe = AdvisoryLock(location, wait_s=0).acquire()
            except InstanceLockError:
                return lock.held  # someone holds it: the watch, on its new session
            probe.release()  # the watch has not re-taken it yet: let it
            return False

        assert wait_for(refused_again, 120, "the lock to be taken again after the restart")
        lock.release()
        AdvisoryLock(location, wait_s=0).acquire().release()  # released for good
    finally:
        cluster.stop()
