"""The night mirrored to the trackers labs read, with the real things: a real `mlflow server` on
loopback (sqlite backend) read back with MLflow's client, and W&B in offline mode read back from
its run files. Each night's numbers in the tracker are compared with overnight's records
(`overnight results --format json`): every finished experiment once, each run's metric by seed,
the verdict's mean, 95 % interval, P(better), n and delta, the tags, params and diff, the
sweep's own numbers. And the failures: a tracker that is down (the night finishes, the records
are whole, the dashboard and `overnight status` say the tracker is behind, `overnight export`
back-fills it once it is back, and refuses clearly while it is not), a slow one (the engine never
waits), one that fails twice (retried), bad input.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from browser_helpers import crash_diff, make_app
from conftest import make_target
from fastapi.testclient import TestClient
from notify_receiver import closed_port
from tracker_fixtures import (
    Forward,
    compare,
    mlflow_server,  # noqa: F401 - the fixtures
    mlflow_starting,  # noqa: F401
    read_mlflow,
    read_wandb,
    records,
)

from agent.core.config import load_config
from agent.core.diff import make_diff
from agent.core.domain import Experiment, Proposal, SweepStatus
from agent.core.ports import ProposalContext
from agent.core.tracking import TrackTable
from agent.engine.loop import Loop, LoopSettings
from agent.engine.scheduler import SchedulerSettings, SlotScheduler
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo
from agent.ops.sweeps import create_sweep
from agent.ops.track import Mirror
from agent.ops.track_record import TrackerError
from db.engine import open_database
from db.reads import Reads
from db.store import SqlStore
from db.track_marks import TrackMarks

OVERNIGHT = Path(sys.executable).parent / "overnight"
FIXTURES = Path(__file__).parent / "fixtures" / "fake_target"


def noisy_target(dest: Path, track: str = "") -> Path:
    """The fake trainer with seed noise (seed 42 is lucky): intervals and P(better) that are
    not degenerate; `track`: a [track] table for its overnight.toml."""
    train = (FIXTURES / "train.py").read_text().replace("NOISE = 0.0", "NOISE = 0.01")
    toml = (FIXTURES / "overnight.toml").read_text() + track
    return make_target(dest, edits={"train.py": train, "overnight.toml": toml})


class Night:
    """A keep (LR, with the knobs proposer's account of its move), a fundamental crash, a
    discard (WIDTH), a small gain (USE_TRICK), then nothing more: the sweep ends."""

    name = "knobs"
    out_of_ideas: str | None = None

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        self.calls += 1
        text = ctx.files["train.py"]
        edits = {1: ("LR = 0.01", "LR = 0.04", {"knob": "LR", "old": "0.01", "new": "0.04"}),
                 3: ("WIDTH = 64", "WIDTH = 32", {}), 4: ("USE_TRICK = False",
                                                           "USE_TRICK = True", {})}
        if self.calls == 2:
            return Proposal("a huge cache", crash_diff(text))
        if self.calls in edits:
            old, new, meta = edits[self.calls]
            return Proposal(f"{old} -> {new}", make_diff("train.py", text,
                                                         text.replace(old, new)), meta=meta)
        return None

    def repair(self, ctx: ProposalContext, failed: Experiment) -> Proposal | None:
        return None


def night(tmp_path: Path, mirror_of: object, db: str | Path | None = None
          ) -> tuple[SqlStore, SlotScheduler]:
    """The real engine on a noisy fake target (its database `db`, else a SQLite file), its
    events heard by `mirror_of(store)`'s mirror (started)."""
    target = noisy_target(tmp_path / "target")
    store = SqlStore(open_database(db or tmp_path / "overnight.db"))
    repo = GitRepo(target)
    create_sweep(store, repo, target, name="night", config=load_config(target),
                 max_experiments=10)
    mirror = mirror_of(store)  # type: ignore[operator]
    loop = Loop(store, repo, SubprocessRunner(grace_s=0.5), LoopSettings(tmp_path / "work"),
                proposer=Night(), on_event=mirror.on_event)
    return store, SlotScheduler(store, SchedulerSettings(), lambda _s, _n: loop)


def stored(store: SqlStore, sweep: str) -> dict[int, Experiment]:
    return {e.id: e for e in store.list_experiments(store.get_sweep(sweep).id)}


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(OVERNIGHT), *args], capture_output=True, text=True,
                          timeout=timeout, check=False,
                          env={**os.environ, "COLUMNS": "250", **(env or {})})


def test_bad_input_names_the_problem_and_changes_nothing(tmp_path):
    target = make_target(tmp_path / "target")
    db = tmp_path / "o.db"
    proc = run_cli("run", "--target", str(target), "--track", "neptune", "--db", str(db))
    assert proc.returncode == 2
    assert "--track: unknown tracker 'neptune' (use mlflow, wandb or none)" in proc.stderr
    assert not db.exists()  # refused before the database was opened
    toml = target / "overnight.toml"
    toml.write_text(toml.read_text() + '\n[track]\nto = "neptune"\n')
    proc = run_cli("run", "--target", str(target), "--db", str(db))
    assert proc.returncode == 2
    assert "[track] to: unknown tracker 'neptune' (use mlflow or wandb)" in proc.stderr
    proc = run_cli("export", "--sweep", "nope", "--to", "neptune", "--db", str(db))
    assert proc.returncode == 2 and "--to: unknown tracker 'neptune'" in proc.stderr
    proc = run_cli("export", "--sweep", "nope", "--to", "mlflow", "--db", str(db))
    assert proc.returncode == 2 and "nope" in proc.stderr
    proc = run_cli("export", "--sweep", "nope", "--to", "mlflow", "--dashboard-url", "ftp://x",
                   "--db", str(db))
    assert proc.returncode == 2 and "--dashboard-url: must be an http:// or https://" in \
        proc.stderr


class Held:
    """A tracker that answers only once released (a slow one), and fails its first
    `fail_first` experiment calls as a tracker that is briefly down would."""

    destination = "held tracker"

    def __init__(self, fail_first: int = 0) -> None:
        self.release = threading.Event()
        self.waiting = threading.Event()
        self.fail_first, self.calls = fail_first, 0
        self.logged: list[int] = []
        self.closed: list[str] = []

    def _hold(self) -> None:
        self.waiting.set()
        assert self.release.wait(120), "never released"

    def check(self) -> None:
        pass

    def open_sweep(self, rec):  # type: ignore[no-untyped-def]
        self._hold()
        return "parent"

    def log_experiment(self, parent, rec):  # type: ignore[no-untyped-def]
        self._hold()
        self.calls += 1
        if self.calls <= self.fail_first:
            raise TrackerError("HTTP 503 (held)")
        self.logged.append(rec.experiment_id)
        return f"run-{rec.experiment_id}"

    def update_verdict(self, parent, remote_id, experiment_id, numbers):  # type: ignore[no-untyped-def]
        pass

    def close_sweep(self, parent, rec):  # type: ignore[no-untyped-def]
        self.closed.append(rec.name)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_slow_tracker_never_delays_the_night_and_a_failing_call_is_retried(
        tmp_path, backend, request):
    db = request.getfixturevalue("pg_url") if backend == "postgres" else None
    held = Held(fail_first=2)
    mirrors: list[Mirror] = []

    def mirror_of(store: SqlStore) -> Mirror:
        mirrors.append(Mirror(store, TrackMarks(store.engine), track=TrackTable(to="mlflow"),
                              factory=lambda _t: held, poll_s=0.05, backoff_s=0.01,
                              retries=3).start())
        return mirrors[0]

    store, slots = night(tmp_path, mirror_of, db)
    slots.run_burst(["night"])  # the whole night while the tracker holds its first call
    sweep = store.get_sweep("night")
    assert sweep.status is SweepStatus.DONE
    assert held.waiting.is_set() and held.logged == []
    finished = [e.id for e in store.list_experiments(sweep.id) if e.status.is_finished()]
    (progress,) = Reads(store).track_progress(sweep.id)  # the dashboard's line
    assert progress.behind == len(finished) and progress.mirrored == 0
    held.release.set()
    mirrors[0].close(timeout_s=60)
    assert sorted(held.logged) == finished and held.calls == len(finished) + 2
    assert held.closed == ["night"]
    (progress,) = Reads(store).track_progress(sweep.id)
    assert progress.up_to_date and progress.closed


def test_a_night_in_wandb_offline_matches_the_records(tmp_path):
    target = noisy_target(tmp_path / "target", '\n[track]\nto = "wandb"\nexperiment = '
                          '"night-w"\ndashboard_url = "http://127.0.0.1:8123/"\n')
    (tmp_path / "wb").mkdir()
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wb"), "WANDB_SILENT": "true"}
    db = tmp_path / "o.db"
    # No --track: the target's own [track] table names the tracker.
    proc = run_cli("run", "--target", str(target), "--sweep", "w", "--experiments", "4",
                   "--budget", "1", "--db", str(db), env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"mirroring the night to wandb offline night-w in {tmp_path / 'wb'}" in proc.stdout
    assert "up to date" in proc.stdout
    got = read_wandb(tmp_path / "wb", "w", "val_bpb")
    recs = records(db, "w")
    store = SqlStore(open_database(db))
    n, problems = compare(got, recs, stored(store, "w"))
    print(f"\nW&B offline: {len(got.children)} experiments, {n} numbers compared with the "
          f"records, {len(problems)} differ")
    assert problems == []
    first = got.children[min(got.children)][0]
    assert first.tags["overnight.link"].startswith("http://127.0.0.1:8123/ui/experiments/")
    assert "kept" in first.tags["labels"]
    again = run_cli("export", "--sweep", "w", "--to", "wandb", "--db", str(db), env=env)
    assert again.returncode == 0, again.stderr  # the same tracker: it holds it all already
    assert "0 experiment(s) logged, 0 verdict(s) updated" in again.stdout
    assert f"up to date ({len(got.children)} experiments)" in again.stdout


def test_the_services_engine_mirrors_a_sweep_by_its_own_track_table(tmp_path, monkeypatch):
    from overnight.runtime import Runtime

    target = noisy_target(tmp_path / "target", '\n[track]\nto = "wandb"\nexperiment = "svc"\n')
    wb = tmp_path / "wb"
    wb.mkdir()
    for key, value in (("WANDB_MODE", "offline"), ("WANDB_DIR", str(wb)),
                       ("WANDB_SILENT", "true")):
        monkeypatch.setenv(key, value)
    rt = Runtime(tmp_path / "o.db", work_dir=tmp_path / "work")
    try:  # what `overnight serve` runs: the engine of a Runtime, its mirror on every sweep
        create_sweep(rt.store, rt.repo_at(target), target, name="svc",
                     config=load_config(target), max_experiments=2)
        rt.start_engine(SchedulerSettings(slots=1, poll_interval_s=0.1))
        deadline = time.monotonic() + 240
        while rt.store.get_sweep("svc").status is not SweepStatus.DONE:  # wait on its state
            assert time.monotonic() < deadline, "the sweep never ended"
            time.sleep(0.1)
    finally:
        rt.close()  # the mirror's last sync: the sweep's end
    got = read_wandb(wb, "svc", "val_bpb")
    store = SqlStore(open_database(tmp_path / "o.db"))
    assert compare(got, records(tmp_path / "o.db", "svc"), stored(store, "svc"))[1] == []
    assert got.parent.tags["overnight.status"] == "done"


def test_a_night_in_mlflow_matches_the_records(tmp_path, mlflow_server, monkeypatch):  # noqa: F811
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    table = TrackTable(to="mlflow", experiment="night-a")
    mirrors: list[Mirror] = []

    def mirror_of(store: SqlStore) -> Mirror:
        reads = Reads(store)
        mirrors.append(Mirror(store, TrackMarks(store.engine), track=table, poll_s=0.2,
                              light=lambda s: reads.experiment_marks(s.id)).start())
        return mirrors[0]

    store, slots = night(tmp_path, mirror_of)
    slots.run_burst(["night"])
    assert store.get_sweep("night").status is SweepStatus.DONE
    mirrors[0].close()
    got = read_mlflow(mlflow_server.uri, "night-a", "night", "val_bpb")
    recs = records(tmp_path / "overnight.db", "night")
    n, problems = compare(got, recs, stored(store, "night"))
    print(f"\nMLflow: {len(got.children)} experiments, {n} numbers compared with the records, "
          f"{len(problems)} differ")
    assert problems == []
    statuses = {runs[0].tags["overnight.status"] for runs in got.children.values()}
    assert {"kept", "crashed", "discarded"} <= statuses
    crashed = [r[0] for r in got.children.values() if r[0].tags["overnight.status"] == "crashed"]
    assert crashed[0].tags["overnight.crash_class"] == "fundamental"
    assert got.parent.tags["overnight.status"] == "done"
    assert got.parent.params["metric"] == "val_bpb"
    # A sync that finds the tracker up to date sends nothing; one whose ledger lost a row (a
    # kill between the tracker's write and the ledger's) finds the run again by its tags.
    ledger = TrackMarks(store.engine)
    dest = mirrors[0].trackers[("mlflow", "night-a")].destination
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM track_experiments WHERE experiment_id = 2")
    again = Mirror(store, ledger, track=table)
    report = again.export("night")
    assert (report.logged, report.updated) == (1, 0)
    assert sorted(ledger.mirrored(store.get_sweep("night").id, dest).experiments) == \
        sorted(got.children)
    regot = read_mlflow(mlflow_server.uri, "night-a", "night", "val_bpb")
    assert compare(regot, recs, stored(store, "night"))[1] == []  # nothing doubled
    assert again.export("night").logged == 0


def test_a_tracker_that_is_down_costs_the_night_nothing(tmp_path, mlflow_server):  # noqa: F811
    port = closed_port()
    down = f"http://127.0.0.1:{port}"
    target = make_target(tmp_path / "target")
    db = tmp_path / "o.db"
    proc = run_cli("run", "--target", str(target), "--sweep", "s", "--experiments", "3",
                   "--budget", "1", "--db", str(db), "--track", "mlflow",
                   env={"MLFLOW_TRACKING_URI": down})
    print(proc.stderr)
    assert proc.returncode == 0, proc.stderr
    statements = ("kept by the test", "kept on one run each", "nothing beat the noise")
    assert any(s in proc.stdout for s in statements), proc.stdout  # the night's last line
    failed = [ln for ln in proc.stderr.splitlines() if "tracking to" in ln and "failed (" in ln]
    assert len(failed) == 1 and f"mlflow {down} experiment overnight" in failed[0]
    recs = records(db, "s")
    finished = [e for e in recs["experiments"] if e["status"] not in ("queued", "running")]
    n = len(finished)
    assert n == 4 and recs["baseline"] is not None  # the records are whole
    behind = f"mlflow {down} experiment overnight: behind by {n} experiment(s), 0 mirrored"
    assert behind in proc.stdout
    assert "back-fill it: overnight export --sweep s --to mlflow" in proc.stdout
    status = run_cli("status", "--db", str(db))
    assert f"s: tracker {behind}" in status.stdout
    with TestClient(make_app(db)) as client:
        page = client.get("/ui/sweeps/s").text
    assert behind in page and "Connection refused" in page
    store = SqlStore(open_database(db))
    ledger_before = _ledger(store)
    # Export while it is still down: a clear error, nothing written.
    refused = run_cli("export", "--sweep", "s", "--to", "mlflow", "--db", str(db),
                      env={"MLFLOW_TRACKING_URI": down})
    assert refused.returncode == 2
    assert (f"error: export of sweep s to mlflow {down} experiment overnight: MLflow at {down}: "
            "[Errno 111] Connection refused") in refused.stderr
    assert _ledger(store) == ledger_before
    # The tracker comes back at its address: export back-fills the night, once.
    back = Forward(port, int(mlflow_server.uri.rsplit(":", 1)[1]))
    try:
        done = run_cli("export", "--sweep", "s", "--to", "mlflow", "--db", str(db),
                       env={"MLFLOW_TRACKING_URI": down})
        assert done.returncode == 0, done.stderr
        assert f"{n} experiment(s) logged, 0 verdict(s) updated, the sweep closed" in done.stdout
        assert f"mlflow {down} experiment overnight: up to date ({n} experiments)" in done.stdout
        got = read_mlflow(down, "overnight", "s", "val_bpb")
    finally:
        back.close()
    assert compare(got, recs, stored(store, "s"))[1] == []
    assert "back-fills it" not in run_cli("status", "--db", str(db)).stdout
    with TestClient(make_app(db)) as client:
        assert f"up to date ({n} experiments)" in client.get("/ui/sweeps/s").text


def _ledger(store: SqlStore) -> list[tuple[object, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r) for table in ("track_sweeps", "track_experiments") for r in
                conn.exec_driver_sql(f"SELECT * FROM {table} ORDER BY 1, 2").all()]
