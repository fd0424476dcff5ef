"""A lack of space: how it is recognised (a real full SQLite database, errno, git's words) and
the engine's DiskSpaceWatch (agent.engine.writes): held writes, best-effort ones, the probes."""

from __future__ import annotations

import errno
import logging
import os
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import event, text

from agent.core.config import TargetConfig
from agent.core.domain import ExperimentStatus, Proposal
from agent.core.errors import ConflictError, OutOfSpaceError, StoreError, is_out_of_space
from agent.core.ports import SweepSpec
from agent.engine.writes import (
    DiskSpaceWatch,
    probe_folder,
    space_checking_runner,
    space_waiting_store,
)
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitError
from db.engine import open_database
from db.store import SqlStore

FULL = OSError(errno.ENOSPC, "No space left on device")


def _spec() -> SweepSpec:
    return SweepSpec(name="s", target_path="/t", branch="overnight/s", proposer="queue",
                     config=TargetConfig(command="python train.py", editable=("train.py",),
                                         metric="val_bpb"))


def _capped_store(tmp_path: Path) -> tuple[SqlStore, list[int]]:
    """A real SQLite store whose file may not grow past its size when `cap` holds a 1: SQLite
    then answers every write that needs a page "database or disk is full" (SQLITE_FULL)."""
    engine = open_database(tmp_path / "o.db")
    cap = [0]

    @event.listens_for(engine, "checkout")
    def _limit(dbapi_conn, _record, _proxy):  # type: ignore[no-untyped-def]
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = cur.execute("PRAGMA page_count").fetchone()[0]
        cur.execute(f"PRAGMA max_page_count = {pages if cap[0] else 2**31 - 2}")
        cur.close()

    return SqlStore(engine), cap


def test_a_full_sqlite_database_is_out_of_space_and_other_errors_are_not(tmp_path: Path) -> None:
    store, cap = _capped_store(tmp_path)
    with store.session("creating a table") as s:
        s.execute(text("CREATE TABLE blobs (b BLOB)"))
    cap[0] = 1
    with pytest.raises(StoreError) as full:
        with store.session("writing a blob") as s:
            s.execute(text("INSERT INTO blobs VALUES (randomblob(100000))"))
    assert full.value.out_of_space and is_out_of_space(full.value)
    assert "database or disk is full" in str(full.value)
    assert store.list_sweeps() == []  # reads still work
    with pytest.raises(StoreError) as other:
        with store.session("reading nothing") as s:
            s.execute(text("SELECT * FROM no_such_table"))
    assert not other.value.out_of_space and not is_out_of_space(other.value)
    cap[0] = 0
    store.check_writes()


def test_what_counts_as_out_of_space() -> None:
    assert is_out_of_space(FULL) and is_out_of_space(OSError(errno.EDQUOT, "quota"))
    assert not is_out_of_space(OSError(errno.EACCES, "Permission denied"))
    assert is_out_of_space(GitError("git commit-tree: fatal: unable to write loose object "
                                    "file: No space left on device"))
    assert not is_out_of_space(GitError("git apply: error: patch failed: train.py:3"))
    assert is_out_of_space(OutOfSpaceError("the run failed while writes failed"))
    assert not is_out_of_space(ConflictError("experiment 3 is already kept"))
    assert not is_out_of_space(KeyboardInterrupt())


def test_a_held_write_waits_out_the_lack_of_space(caplog: pytest.LogCaptureFixture) -> None:
    """Tried again until it succeeds; the state says writes fail meanwhile and ends (with a log
    line) only when the probes succeed too."""
    tries: list[int] = []
    probe_full = [True]

    def write() -> int:
        tries.append(1)
        if len(tries) < 3:
            raise FULL
        return 7

    def probe() -> None:
        if probe_full[0]:
            raise FULL

    disk_space = DiskSpaceWatch(probes=[probe], first_wait_s=0.01, max_wait_s=0.02)
    seen: list[object] = []
    with caplog.at_level(logging.INFO, logger="agent.engine.writes"):
        assert disk_space.retry_while_disk_full(
            lambda: (seen.append(disk_space.failing), write())[1], "a run's end") == 7
        assert len(tries) == 3 and seen[1] is not None  # failing while it waited
        assert disk_space.failing is not None  # the probe still fails
        assert not disk_space.probe_when_due(force=True)
        probe_full[0] = False
        assert disk_space.probe_when_due(force=True) and disk_space.failing is None
    assert "writes fail for lack of space (a run's end" in caplog.text
    assert "writes succeed again" in caplog.text


def test_other_errors_pass_at_once_and_a_stop_ends_the_wait() -> None:
    disk_space = DiskSpaceWatch(first_wait_s=0.01, max_wait_s=0.05)
    with pytest.raises(ConflictError):
        disk_space.retry_while_disk_full(
            lambda: (_ for _ in ()).throw(ConflictError("finished")))
    assert disk_space.failing is None
    failed: list[BaseException] = []

    def hold_forever() -> None:
        try:
            disk_space.retry_while_disk_full(lambda: (_ for _ in ()).throw(FULL))
        except OSError as exc:
            failed.append(exc)

    t = threading.Thread(target=hold_forever)
    t.start()
    while disk_space.failing is None:  # wait on state: it entered the wait
        t.join(0.01)
    disk_space.stop()
    t.join(60)
    assert not t.is_alive() and failed == [FULL]


def test_best_effort_writes_fail_at_once_and_are_noted() -> None:
    disk_space = DiskSpaceWatch(first_wait_s=10.0)
    with disk_space.best_effort(), pytest.raises(OSError):
        disk_space.retry_while_disk_full(lambda: (_ for _ in ()).throw(FULL), "a loss point")
    assert disk_space.failing is not None and "a loss point" in disk_space.failing.reason


def test_the_engines_store_holds_every_call(tmp_path: Path) -> None:
    """space_waiting_store: a write that meets a full database waits, then lands once; the
    wrapped store's errors other than a lack of space pass as they are."""
    store, cap = _capped_store(tmp_path)
    sweep = store.create_sweep(_spec())
    disk_space = DiskSpaceWatch(first_wait_s=0.01, max_wait_s=0.05)
    held = space_waiting_store(store, disk_space)
    cap[0] = 1
    done: list[object] = []
    t = threading.Thread(target=lambda: done.append(held.add_experiment(
        sweep.id, Proposal("a change " + "x" * 20000, "diff " * 20000, "queue"))))
    t.start()
    while disk_space.failing is None:
        t.join(0.01)
    assert t.is_alive() and store.count_experiments(sweep.id) == 0
    cap[0] = 0
    t.join(60)
    assert not t.is_alive() and len(done) == 1
    assert [e.status for e in store.list_experiments(sweep.id)] == [ExperimentStatus.QUEUED]
    with pytest.raises(ConflictError):  # a second sweep of that name: refused, not held
        held.create_sweep(_spec())


def test_a_run_that_failed_while_writes_fail_is_an_interruption(tmp_path: Path) -> None:
    """A real run that exits 1: with the disk full (the probe fails) it is the disk's doing
    (OutOfSpaceError); with space, it is the run's own failure (returned as it is)."""
    full = [True]

    def probe() -> None:
        if full[0]:
            raise FULL

    disk_space = DiskSpaceWatch(probes=[probe])
    runner = space_checking_runner(SubprocessRunner(grace_s=1.0), disk_space)
    argv = [sys.executable, "-c", "raise SystemExit(1)"]

    def run() -> object:
        return runner.run(argv, cwd=tmp_path, log_path=tmp_path / "run.log", timeout_s=60)

    with pytest.raises(OutOfSpaceError):
        run()
    assert disk_space.failing is not None
    full[0] = False
    assert disk_space.probe_when_due(force=True)
    result = run()
    assert result.exit_code == 1  # type: ignore[attr-defined]


def test_the_folder_probe_leaves_nothing(tmp_path: Path) -> None:
    probe_folder(tmp_path / "work")
    assert list((tmp_path / "work").iterdir()) == []


def test_a_full_postgres_disk_is_out_of_space(pg_cluster) -> None:  # type: ignore[no-untyped-def]
    """A real PostgreSQL database in a tablespace on a small tmpfs, filled: its "could not
    extend file ... No space left on device" (SQLSTATE 53100) is out of space; reads work."""
    import os
    import pwd
    import shutil
    import subprocess
    import tempfile

    from chaos_fixtures import fill, mount_tmpfs

    where = Path(tempfile.mkdtemp(prefix="overnight-space-", dir="/tmp"))
    why = mount_tmpfs(where, 16)
    if why is not None:
        shutil.rmtree(where, ignore_errors=True)
        pytest.skip(f"no small filesystem to fill: {why}")
    space, name = f"small_{os.getpid()}", f"full_{os.getpid()}"
    try:
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(where, owner.pw_uid, owner.pw_gid)
        pg_cluster.execute(f"CREATE TABLESPACE {space} LOCATION '{where}'")
        pg_cluster.execute(f"CREATE DATABASE {name} TEMPLATE overnight_template "
                           f"TABLESPACE {space}")
        engine = open_database(pg_cluster.url(name))
        store = SqlStore(engine)
        try:
            filler = fill(where)
            with pytest.raises(StoreError) as full:
                store.create_sweep(_spec())
            assert full.value.out_of_space, full.value
            assert "No space left on device" in str(full.value)
            assert store.list_sweeps() == []
            filler.unlink()
            assert store.create_sweep(_spec()).name == "s"
        finally:
            engine.dispose()
    finally:
        pg_cluster.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        pg_cluster.execute(f"DROP TABLESPACE IF EXISTS {space}")
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=60)
        shutil.rmtree(where, ignore_errors=True)


def test_an_error_that_does_not_say_why_counts_when_the_probes_find_no_space() -> None:
    """git's `worktree add` on a full disk says only "unable to write file train.py": with
    `probe`, the probes decide; the service's own errors are never probed."""
    full = [False]
    probes: list[int] = []

    def probe() -> None:
        probes.append(1)
        if full[0]:
            raise FULL

    disk_space = DiskSpaceWatch(probes=[probe])
    vague = GitError("git worktree: error: unable to write file train.py")
    assert not disk_space.note_failure(vague) and not probes
    assert not disk_space.note_failure(vague, probe=True) and disk_space.failing is None
    full[0] = True
    assert not disk_space.note_failure(ConflictError("already kept"), probe=True)
    assert len(probes) == 1
    assert disk_space.note_failure(vague, "adding a worktree", probe=True)
    assert disk_space.failing is not None and "adding a worktree" in disk_space.failing.reason


def test_a_foreground_run_waits_out_a_full_disk_and_finishes(tmp_path: Path) -> None:
    """`overnight run`'s engine (burst mode) on a real tmpfs filled while a run is in flight:
    it holds (it does not end the night for want of work), records every result once space is
    back, and ends with a verdict for every experiment."""
    import shutil
    import subprocess

    from chaos_fixtures import fill, mount_tmpfs
    from service_fixtures import knob_diff, make_counting_target, read_run_log

    from agent.engine.scheduler import SchedulerSettings, SlotScheduler
    from agent.ops.sweeps import create_sweep
    from overnight.runtime import Runtime

    disk = tmp_path / "disk"
    why = mount_tmpfs(disk, 32)
    if why is not None:
        pytest.skip(f"no small filesystem to fill: {why}")
    try:
        runs_file = tmp_path / "runs.txt"
        target = make_counting_target(disk / "target", sleep_s=1.0, n_knobs=4, pad=6000)
        rt = Runtime(disk / "o.db")
        try:
            sweep = create_sweep(rt.store, rt.repo_at(target), target, name="f",
                                 proposer="queue")
            for k in range(3):
                rt.service.queue("f", Proposal(f"K{k}", knob_diff(target, k, 1), "queue"))
            settings = SchedulerSettings(poll_interval_s=0.05,
                                         extra_env={"FAKE_RUN_LOG": str(runs_file)})
            engine = SlotScheduler(rt.store, settings, rt.loop_factory(settings),
                                   disk_space=rt.disk_space)
            night = threading.Thread(target=engine.run_burst, args=(["f"],))
            os.environ["FAKE_RUN_LOG"] = str(runs_file)  # pass_env reads it from here
            night.start()
            while not any(e == 3 for e, _ in read_run_log(runs_file)):  # K1's run started
                night.join(0.02)
            filler = fill(disk)
            while rt.disk_space.failing is None:  # wait on state: the engine noticed
                assert night.is_alive()
                night.join(0.05)
            assert night.is_alive() and rt.store.get_sweep("f").status.value == "running"
            filler.unlink()
            night.join(600)
            assert not night.is_alive()
            exps = rt.store.list_experiments(sweep.id)
            assert rt.disk_space.failing is None
            assert all(e.status.is_finished() for e in exps), [(e.id, e.status) for e in exps]
            follow = {e.retry_of for e in exps if e.retry_of}
            assert all(e.id in follow for e in exps if e.status is ExperimentStatus.INTERRUPTED)
            assert rt.store.get_sweep("f").status.value == "running"  # never paused
        finally:
            os.environ.pop("FAKE_RUN_LOG", None)
            rt.close()
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=60)
        shutil.rmtree(disk, ignore_errors=True)
