"""A run is a guest: allow-listed environment, a run id, a bounded loss curve, private files.

The loop on a real git repo, a real SQLite store and real trainer subprocesses.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from conftest import make_target

from agent.core.config import load_config
from agent.core.domain import ExperimentStatus
from agent.engine.attempt import MAX_LOSS_POINTS, run_id_prefix
from agent.git.repo import GitRepo
from agent.ops.sweeps import create_sweep
from db.reads import Reads
from runner.tree import RUN_ID_ENV

SECRETS = {"ANTHROPIC_API_KEY": "sk-ant-fake-0001", "OPENAI_API_KEY": "sk-fake-0002",
           "OVERNIGHT_TOKEN": "fake-token-0003-abcdefgh"}
ENV_DUMP = '''
import os
with open("env.dump", "w") as handle:
    for k, v in sorted(os.environ.items()):
        handle.write(f"{k}={v}\\n")
print(open("env.dump").read())
'''


def toml_with(target: Path, extra: str) -> None:
    path = target / "overnight.toml"
    path.write_text(path.read_text() + extra)


def run_baseline(store, target, make_loop, **settings):  # type: ignore[no-untyped-def]
    sweep = create_sweep(store, GitRepo(target), target, name="g", config=load_config(target))
    loop = make_loop(target, **settings)
    exp = store.claim_next(sweep.id)
    return loop, sweep, loop.execute(sweep, exp)


def test_trainer_never_sees_the_token_or_llm_keys(tmp_path, store, make_loop, monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WANDB_PROJECT", "night")
    source = (Path(__file__).parent / "fixtures" / "fake_target" / "train.py").read_text()
    target = make_target(tmp_path / "t", edits={"train.py": ENV_DUMP + source})
    toml_with(target, 'pass_env  = ["WANDB_PROJECT"]\n')
    loop, sweep, done = run_baseline(store, target, make_loop)
    assert done.status is ExperimentStatus.KEPT, done.reason
    log = Path(done.log_path or "").read_text()
    dumped = dict(line.split("=", 1) for line in log.splitlines() if "=" in line[:60])
    assert not set(SECRETS) & set(dumped)
    assert not any(value in log for value in SECRETS.values())
    assert dumped["WANDB_PROJECT"] == "night" and dumped["OVERNIGHT_SEED"] == "42"
    work = tmp_path / "work"
    assert dumped[RUN_ID_ENV] == run_id_prefix(work, done.id) + "0"


def test_a_flood_of_progress_lines_is_stored_as_a_bounded_curve(tmp_path, store, make_loop):
    source = (Path(__file__).parent / "fixtures" / "fake_target" / "train.py").read_text()
    flood = source.replace(
        'for step in range(1, 4):\n    print(f"step {step} | loss {5.0 / step:.4f} | elapsed '
        '{time.time() - start:.2f}s", flush=True)\n    time.sleep(min(SLEEP_S, budget) / 3)',
        'for step in range(1, 100_001):\n    print(f"step {step} | loss {5.0 / step:.4f}")')
    assert flood != source
    target = make_target(tmp_path / "t", edits={"train.py": flood})
    loop, sweep, done = run_baseline(store, target, make_loop)
    assert done.status is ExperimentStatus.KEPT, done.reason
    points = Reads(store).loss_points(done.id)
    assert MAX_LOSS_POINTS // 2 <= len(points) <= MAX_LOSS_POINTS + 1
    assert points[0].step == 1 and points[-1].step == 100_000
    steps = [p.step for p in points]
    assert steps == sorted(set(steps))


def test_logs_and_work_folder_are_private(tmp_path, store, target, make_loop):
    loop, sweep, done = run_baseline(store, target, make_loop)
    log = Path(done.log_path or "")
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    for folder in (tmp_path / "work", log.parent.parent, log.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_missing_bwrap_is_refused_and_never_runs_unsandboxed(
    tmp_path, store, target, make_loop, monkeypatch
):
    import shutil

    from agent.core.errors import ConfigError

    toml_with(target, 'sandbox   = "bwrap"\n')
    real_which = shutil.which

    def which_without_bwrap(name, *args, **kwargs):  # a machine without bubblewrap
        return None if name == "bwrap" else real_which(name, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(shutil, "which", which_without_bwrap)
        with pytest.raises(ConfigError, match="bubblewrap"):
            create_sweep(store, GitRepo(target), target, name="nb", config=load_config(target))
    if real_which("bwrap") is None:
        pytest.skip("the rest needs bubblewrap installed (./dev.sh test installs it)")
    sweep = create_sweep(store, GitRepo(target), target, name="g", config=load_config(target))
    monkeypatch.setattr(shutil, "which", which_without_bwrap)  # uninstalled since
    done = make_loop(target).execute(sweep, store.claim_next(sweep.id))
    assert done.status is ExperimentStatus.CRASHED
    assert "bwrap" in (done.log_tail or "")


def test_database_token_and_lock_are_private(tmp_path):
    from agent.engine.recovery import InstanceLock
    from api.settings import ensure_token
    from db.engine import open_database
    from db.store import SqlStore

    db = tmp_path / "home" / "overnight.db"
    store = SqlStore(open_database(db))
    store.list_sweeps()
    _, token, _ = ensure_token(db)
    lock = InstanceLock(db).acquire()
    try:
        assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
        for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), token, lock.path):
            assert path.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600, path
    finally:
        lock.release()


def test_loss_curve_stays_bounded_and_keeps_the_ends():
    from agent.engine.attempt import LossCurve
    from runner.summary import ProgressPoint

    curve = LossCurve(cap=100)
    for step in range(1, 100_001):
        curve.add(ProgressPoint(step, 1.0 / step, None))
    points = curve.points(with_last=True)
    assert len(points) <= 101 and len(points) >= 50
    assert points[0].step == 1 and points[-1].step == 100_000
    gaps = {b.step - a.step for a, b in zip(points[:-2], points[1:-1], strict=True)}
    assert len(gaps) == 1  # evenly spaced: one stride
