"""`overnight gc` (issue 14 part 4) on a real SQLite file, real log files and real git
worktrees: what it removes and keeps, that --dry-run changes nothing, that queued and running
experiments are untouched, and that a pruned experiment still reads well in the API and the
dashboard (its log says it was pruned; no 500)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_fixtures import AUTH, ServerProcess, make_counting_target, wait_for
from storage_fixtures import Night, seed_night

from agent.core.domain import ExperimentStatus, Proposal
from agent.ops.retention import downsample, parse_age
from db.engine import open_database
from db.reads import Reads
from db.store import SqlStore
from runner.summary import ProgressPoint

S = ExperimentStatus
OVERNIGHT = str(Path(sys.executable).with_name("overnight"))


def gc(db: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([OVERNIGHT, "gc", "--db", str(db), *args], capture_output=True,
                          text=True, timeout=300)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


class Scene:
    """Two nights in one database: one 9 days old (with two leftover worktrees, and a queued
    and a running experiment added to it now), one an hour old."""

    def __init__(self, tmp: Path) -> None:
        self.db = tmp / "o.db"
        self.work = tmp / "o.db.work"
        self.store = SqlStore(open_database(self.db))
        target = make_counting_target(tmp / "target", n_knobs=40)
        self.old = seed_night(self.store, target, self.work, sweep="old", experiments=14,
                              steps=300, age=timedelta(days=9), leftover_worktrees=2)
        self.new = seed_night(self.store, make_counting_target(tmp / "t2", n_knobs=40),
                              self.work, sweep="new", experiments=4, steps=300,
                              age=timedelta(hours=1), seed=1)
        sweep = self.store.get_sweep("old")
        self.queued = self.store.add_experiment(sweep.id, Proposal("queued", "--- q\n")).id
        run = self.store.add_experiment(sweep.id, Proposal("running", "--- r\n")).id
        self.store.claim(run)
        self.running_log = self.work / "logs" / "old" / f"{run}.log"
        self.running_log.write_text("step 1 | loss 3.0\n")
        self.store.mark_started(run, log_path=str(self.running_log))
        self.running_tree = self.work / "worktrees" / "old" / f"exp-{run}"
        self.running_tree.mkdir(parents=True)
        (self.running_tree / "train.py").write_text("in use\n")
        self.running = run
        self.store.engine.dispose()

    def experiments(self) -> dict[int, Any]:
        store = SqlStore(open_database(self.db))
        try:
            return {e.id: (e, Reads(store).loss_points(e.id), store.list_runs(experiment_id=e.id))
                    for e in store.list_experiments()}
        finally:
            store.engine.dispose()

    def files(self) -> dict[str, int]:
        return {str(p): p.lstat().st_size for p in sorted(self.work.rglob("*"))
                if p.is_file() or p.is_symlink()}


def pruned_ids(night: Night) -> list[int]:
    return [i for s, ids in night.ids.items() if s is not S.KEPT for i in ids]


@pytest.fixture
def scene(tmp_path: Path) -> Scene:
    return Scene(tmp_path)


def test_gc_prunes_old_runs_and_keeps_what_is_read_later(scene: Scene) -> None:
    before = scene.experiments()
    db_bytes = scene.db.stat().st_size
    out = gc(scene.db, "--older-than", "7d", "--vacuum", "always").stdout
    after = scene.experiments()
    old = pruned_ids(scene.old)
    assert old and f"pruned {len(old)} experiments" in out
    for exp_id in old:
        (was, points, runs), (now, thin, now_runs) = before[exp_id], after[exp_id]
        assert now.pruned_at is not None and now.log_path is None
        assert not Path(was.log_path).exists()
        assert all(r.log_path is None for r in now_runs) and runs
        for field in ("diff", "metric", "summary", "log_tail", "commit", "ref", "status"):
            assert getattr(now, field) == getattr(was, field), field
        assert len(thin) == 64 < len(points)
        assert min(p.loss for p in thin) == min(p.loss for p in points)
    untouched = scene.old.ids[S.KEPT] + [i for ids in scene.new.ids.values() for i in ids]
    for exp_id in untouched + [scene.queued, scene.running]:
        assert after[exp_id] == before[exp_id], exp_id
        log = after[exp_id][0].log_path
        assert log is None or Path(log).is_file()
    assert after[scene.running][0].status is S.RUNNING and scene.running_log.is_file()
    assert scene.running_tree.joinpath("train.py").read_text() == "in use\n"
    assert scene.old.worktrees and not any(wt.exists() for wt in scene.old.worktrees)
    listed = subprocess.run(["git", "worktree", "list"], cwd=scene.db.parent / "target",
                            capture_output=True, text=True, check=True).stdout
    assert not any(str(wt) in listed for wt in scene.old.worktrees)
    refs = subprocess.run(["git", "for-each-ref", "refs/overnight/old"], text=True,
                          cwd=scene.db.parent / "target", capture_output=True).stdout
    assert all(f"refs/overnight/old/{i}" in refs for i in old)  # hidden refs stay
    assert "VACUUM: database" in out and scene.db.stat().st_size < db_bytes
    again = gc(scene.db, "--older-than", "7d").stdout  # --vacuum auto: too little to gain
    assert "pruned 0 experiments" in again and "VACUUM: not run" in again


def test_dry_run_changes_nothing(scene: Scene) -> None:
    rows, files = scene.experiments(), scene.files()
    out = gc(scene.db, "--older-than", "7d", "--dry-run", "--vacuum", "always").stdout
    assert f"would prune {len(pruned_ids(scene.old))} experiments" in out
    assert "2 leftover worktrees" in out and "VACUUM: would run" in out
    assert scene.experiments() == rows
    assert scene.files() == files


def test_kept_diffs_stay_even_when_their_logs_go(scene: Scene) -> None:
    before = scene.experiments()
    gc(scene.db, "--older-than", "7d", "--keep-logs-of", "none", "--loss-points", "0")
    after = scene.experiments()
    for exp_id in scene.old.ids[S.KEPT]:
        assert after[exp_id][0].log_path is None and after[exp_id][1] == []
        assert after[exp_id][0].diff == before[exp_id][0].diff
        assert after[exp_id][0].commit == before[exp_id][0].commit


@pytest.mark.parametrize(("args", "named"), [
    (["--older-than", "7x"], "age '7x'"),
    (["--keep-logs-of", "kept,bogus"], "status bogus"),
    (["--keep-logs-of", "running"], "status running"),
])
def test_bad_options_are_refused_and_change_nothing(scene: Scene, args: list[str],
                                                    named: str) -> None:
    rows, files = scene.experiments(), scene.files()
    done = gc(scene.db, *args, check=False)
    assert done.returncode == 2 and named in done.stderr
    assert scene.experiments() == rows and scene.files() == files


def test_a_pruned_experiment_still_reads_in_the_api_and_the_dashboard(scene: Scene,
                                                                      tmp_path: Path) -> None:
    gc(scene.db, "--older-than", "7d", "--json")
    exp_id = pruned_ids(scene.old)[0]
    server = ServerProcess(scene.db, log=tmp_path / "server.log", slots=0).start()
    try:
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
            exp = c.get(f"/experiments/{exp_id}").json()
            assert exp["diff"].startswith("--- a/train.py") and exp["status"] != "kept"
            log = c.get(f"/experiments/{exp_id}/log")
            assert log.status_code == 200
            assert log.text.startswith("[the full log was pruned by `overnight gc` on ")
            assert "loss" in log.text  # the tail stored at finish follows
            page = c.get(f"/ui/experiments/{exp_id}")
            assert page.status_code == 200 and "pruned by" in page.text
            download = c.get(f"/ui/experiments/{exp_id}/log.txt")
            assert download.status_code == 200 and download.text.startswith("[the full log")
            assert c.get(f"/ui/experiments/{exp_id}/tail").status_code == 200
    finally:
        server.stop()
    assert "Traceback" not in server.tail(1_000_000)


def test_gc_json_reports_bytes_before_and_after(scene: Scene) -> None:
    report = json.loads(gc(scene.db, "--older-than", "7d", "--json").stdout)
    before, after = report["before"], report["after"]
    assert before["experiments"] == after["experiments"] > 0
    assert after["log_bytes"] < before["log_bytes"]
    assert after["bytes_per_experiment"] < before["bytes_per_experiment"]
    assert report["gc"]["experiments"] == len(pruned_ids(scene.old))


def test_downsample_keeps_the_ends_and_the_lowest_loss() -> None:
    points = [ProgressPoint(s, 10.0 - (s == 37) * 9, None) for s in range(200)]
    thin = downsample(points, 10)
    assert len(thin) == 10 and thin[0].step == 0 and thin[-1].step == 199
    assert min(p.loss for p in thin) == 1.0
    assert downsample(points[:5], 10) == points[:5] and downsample(points, 0) == []
    assert parse_age("36h") == timedelta(hours=36) and parse_age("2w") == timedelta(days=14)


def test_serve_with_a_retention_setting_prunes_on_its_own(scene: Scene, tmp_path: Path) -> None:
    """`overnight serve --retention 7d` runs the same gc (at start, then every 6 h)."""
    old = pruned_ids(scene.old)
    server = ServerProcess(scene.db, log=tmp_path / "server.log", slots=0,
                           extra=["--retention", "7d"]).start()
    try:
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
            def pruned() -> bool:
                return all(c.get(f"/experiments/{i}/log").text.startswith("[the full log was "
                                                                          "pruned")
                           for i in old)

            wait_for(pruned, 120, "the retention pass to prune the old night")
            kept = scene.old.ids[S.KEPT][0]
            assert not c.get(f"/experiments/{kept}/log").text.startswith("[the full log")
    finally:
        server.stop()
    assert "Traceback" not in server.tail(1_000_000)
    assert not any(Path(e.log_path or "/nonexistent").exists() for e, _, _ in
                   (scene.experiments()[i] for i in old))


def test_a_bad_retention_setting_is_refused(tmp_path: Path) -> None:
    done = subprocess.run([OVERNIGHT, "serve", "--db", str(tmp_path / "o.db"), "--port", "0",
                           "--retention", "soon"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "retention" in done.stderr and "'soon'" in done.stderr
