"""Slots on fake devices: every slot pinned to its GPU, a slot whose device keeps failing is taken
out while the others go on; `overnight run --slots N` through the console script."""

from __future__ import annotations

import difflib
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from agent.core.domain import ExperimentStatus, Proposal
from agent.engine.scheduler import SchedulerSettings, SlotScheduler
from agent.git.repo import init_repo
from agent.ops.sweeps import create_sweep
from overnight.runtime import Runtime

TRAIN = '''"""Fake trainer: logs its device; the BAD one fails (CUDA error) except the baseline."""
import os
import sys
import time

{knobs}
X = sum(v for k, v in dict(globals()).items() if k.startswith("K"))
dev = os.environ.get("CUDA_VISIBLE_DEVICES", "none")
with open(os.environ["OVERNIGHT_TEST_DEVICE_LOG"], "a") as fh:
    fh.write(f"{os.environ['OVERNIGHT_EXPERIMENT_ID']} {dev} {os.environ['OVERNIGHT_SEED']}\\n")
if dev == os.environ.get("OVERNIGHT_TEST_BAD_DEVICE") and X != 0:
    print("RuntimeError: CUDA error: unspecified launch failure", file=sys.stderr)
    sys.exit(1)
time.sleep(0.2)
print("step 1 | loss 1.0 | elapsed 0.2s")
print("---")
print(f"val_bpb: {1.0 - X * 0.001:.6f}")
print("training_seconds: 0.2")
'''
KNOBS = "\n".join(f"K{i} = 0\n" + "#\n" * 7 for i in range(1, 9))
TRAIN = TRAIN.replace("{knobs}", KNOBS)
TOML = '''[target]
command = "python train.py"
editable = ["train.py"]
metric = "val_bpb"
budget_s = 1
timeout_s = 30
'''


def make_target(path: Path) -> Path:
    path.mkdir()
    (path / "train.py").write_text(TRAIN)
    (path / "overnight.toml").write_text(TOML)
    init_repo(path)
    return path


def x_diff(knob: int) -> str:
    """Set K<knob> to 1: diffs on different knobs never conflict, so all can be kept."""
    old = TRAIN.splitlines(True)
    new = [line.replace(f"K{knob} = 0\n", f"K{knob} = 1\n") for line in old]
    return "".join(difflib.unified_diff(old, new, "a/train.py", "b/train.py"))


def device_log(path: Path) -> dict[int, str]:
    """Experiment id -> the device of its first run; no (experiment, seed) may run twice (the
    keep rule runs an experiment several times, each time with the next seed)."""
    rows = [line.split() for line in path.read_text().splitlines()]
    assert len({(exp, seed) for exp, _, seed in rows}) == len(rows), rows
    devices: dict[int, str] = {}
    for exp, dev, _ in rows:
        devices.setdefault(int(exp), dev)
    return devices


@pytest.fixture
def night(tmp_path: Path):  # type: ignore[no-untyped-def]
    target = make_target(tmp_path / "target")
    runtime = Runtime(tmp_path / "o.db")
    sweep = create_sweep(runtime.store, runtime.repo_at(target), target, name="n",
                         proposer="queue")
    ids = [runtime.store.add_experiment(sweep.id, Proposal(f"K{k} on", x_diff(k))).id
           for k in range(1, 9)]
    return runtime, sweep, ids, tmp_path / "devices.log"


def burst(runtime: Runtime, log: Path, bad: str = "") -> SlotScheduler:
    env = {"OVERNIGHT_TEST_DEVICE_LOG": str(log), "OVERNIGHT_TEST_BAD_DEVICE": bad}
    settings = SchedulerSettings(slots=2, devices=("3", "5"), grace_s=1.0, extra_env=env,
                                 poll_interval_s=0.1)
    engine = SlotScheduler(runtime.store, settings, runtime.loop_factory(settings))
    engine.run_burst(["n"])
    return engine


def test_each_slot_runs_on_its_own_device(night) -> None:  # type: ignore[no-untyped-def]
    runtime, sweep, ids, log = night
    engine = burst(runtime, log)
    seen = device_log(log)
    assert set(seen.values()) == {"3", "5"}  # both GPUs were used, nothing unpinned
    assert {1, *ids} <= set(seen)  # the baseline and all eight ran (re-runs on a moved head
    # have ids of their own)
    statuses = Counter(e.status for e in runtime.store.list_experiments(sweep.id))
    assert statuses[ExperimentStatus.QUEUED] == 0 and statuses[ExperimentStatus.CRASHED] == 0
    assert engine.retired == {}


def test_a_failing_device_takes_its_slot_out(night) -> None:  # type: ignore[no-untyped-def]
    runtime, sweep, ids, log = night
    engine = burst(runtime, log, bad="5")
    assert list(engine.retired) == [1]
    assert "slot 1 (GPU 5) taken out after 3 device failures" in engine.retired[1]
    exps = {e.id: e for e in runtime.store.list_experiments(sweep.id)}
    seen = device_log(log)
    on_bad = [i for i in ids if seen.get(i) == "5"]
    assert len(on_bad) == 3  # three failures in a row, then the slot stopped taking work
    assert all(exps[i].status is ExperimentStatus.CRASHED for i in on_bad)
    rest = [i for i in ids if i not in on_bad]
    assert all(seen[i] == "3" for i in rest)  # the healthy slot ran everything else
    assert all(exps[i].status in (ExperimentStatus.KEPT, ExperimentStatus.DISCARDED)
               for i in rest)


@pytest.mark.slow
def test_overnight_run_with_two_slots(tmp_path: Path) -> None:
    """The console script: `overnight run --slots 2` runs a knobs sweep on the one engine."""
    target = tmp_path / "t"
    src = Path(__file__).parent / "fixtures" / "fake_target"
    import shutil

    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
    init_repo(target)
    overnight = Path(sys.executable).parent / "overnight"
    proc = subprocess.run(
        [str(overnight), "run", "--target", str(target), "--experiments", "4", "--slots", "2",
         "--devices", "0,1", "--db", str(tmp_path / "o.db"), "--sweep", "two"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runtime = Runtime(tmp_path / "o.db")
    sweep = runtime.store.get_sweep("two")
    exps = runtime.store.list_experiments(sweep.id)
    used = [e for e in exps if not e.is_baseline and e.status is not ExperimentStatus.QUEUED]
    assert len(used) == 4 and sweep.status.value == "done"
    assert runtime.repo_at(target).head(sweep.branch) == sweep.best_commit


def test_slots_add_and_remove_worktrees_of_one_repository_at_once(tmp_path: Path):
    """git's worktree add/remove are not safe at once on one repository; slots take turns."""
    import threading

    from agent.git.repo import GitRepo

    target = make_target(tmp_path / "target")
    head = GitRepo(target).head("HEAD")
    errors: list[BaseException] = []

    def churn(slot: int) -> None:
        repo = GitRepo(target)  # each slot's loop may hold its own adapter
        try:
            for i in range(30):
                wt = tmp_path / "wt" / f"s{slot}-{i}"
                repo.add_worktree(wt, head)
                assert (wt / "train.py").is_file()
                repo.remove_worktree(wt)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
