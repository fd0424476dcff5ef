"""Early stop of clearly losing runs in the real engine: a fake trainer with realistic curves
(tests/fixtures/curve_target) runs a short night on 1 and 4 slots; a clearly losing change is
stopped at a check and its process tree is gone, a null change and a crossing-curve schedule
change run to the end, and `prune = "off"` stops nothing."""

from __future__ import annotations

import difflib
import os
import shutil
from pathlib import Path

import pytest

from agent.core.domain import ExperimentStatus, Proposal, RunRole, RunStatus
from agent.engine.early_stop import RunCurve, loss_pairs, step_at
from agent.engine.scheduler import SchedulerSettings, SlotScheduler
from agent.git.repo import init_repo
from agent.ops.sweeps import create_sweep
from agent.rules.prune import PrunePolicy, check
from overnight.runtime import Runtime

CURVES = Path(__file__).parent / "fixtures" / "curve_target"
LOSING = ("A_SHIFT", "0.3", "a worse loss everywhere")
NULL = ("UNUSED", "1", "a knob that changes nothing")
CROSSING = ("WARMDOWN_FRAC", "0.5", "warm-down: slower early, lower at the end")


def make_target(dest: Path, prune: str) -> Path:
    shutil.copytree(CURVES, dest, ignore=shutil.ignore_patterns("__pycache__"))
    toml = dest / "overnight.toml"
    toml.write_text(toml.read_text().replace('prune    = "auto"', f'prune    = "{prune}"'))
    init_repo(dest)
    return dest


def knob_diff(target: Path, name: str, value: str) -> str:
    old = (target / "train.py").read_text().splitlines(True)
    new = [f"{name} = {value}" + line[line.index("  #"):] if line.startswith(f"{name} = ")
           else line for line in old]
    assert new != old, name
    return "".join(difflib.unified_diff(old, new, "a/train.py", "b/train.py"))


def night(tmp: Path, prune: str, slots: int, changes: list[tuple[str, str, str]]):  # type: ignore[no-untyped-def]
    target = make_target(tmp / "target", prune)
    runtime = Runtime(tmp / "o.db")
    sweep = create_sweep(runtime.store, runtime.repo_at(target), target, name="n",
                         proposer="queue")
    ids = {name: runtime.store.add_experiment(
        sweep.id, Proposal(f"{name} = {value}: {what}", knob_diff(target, name, value))).id
        for name, value, what in changes}
    settings = SchedulerSettings(slots=slots, grace_s=1.0, poll_interval_s=0.1)
    SlotScheduler(runtime.store, settings, runtime.loop_factory(settings)).run_burst(["n"])
    return runtime, sweep, ids


def gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("slots", [1, 4])
def test_a_clearly_losing_change_is_stopped_and_the_others_run_on(tmp_path: Path,
                                                                  slots: int) -> None:
    runtime, sweep, ids = night(tmp_path, "auto", slots, [LOSING, NULL, CROSSING])
    store = runtime.store
    exps = {e.id: e for e in store.list_experiments(sweep.id)}
    losing = exps[ids["A_SHIFT"]]
    assert losing.status is ExperimentStatus.DISCARDED and losing.crash_kind is None
    assert losing.reason is not None and losing.reason.startswith("stopped at ")
    assert "of the budget: loss" in losing.reason and "the incumbent's" in losing.reason
    (run,) = store.list_runs(experiment_id=losing.id)  # no more runs after a stop
    assert run.status is RunStatus.PRUNED and run.role is RunRole.SCREEN
    assert run.note == losing.reason and run.metric is None
    assert run.pgid is not None and gone(run.pgid)
    assert run.curve is not None and run.curve[-1][0] < 1.0  # it did not train to the end
    assert run.training_s is not None and run.training_s < sweep.config.budget_s
    for name in ("UNUSED", "WARMDOWN_FRAC"):
        exp = exps[ids[name]]
        assert exp.status in (ExperimentStatus.KEPT, ExperimentStatus.DISCARDED), exp
        assert not (exp.reason or "").startswith("stopped at ")
        runs = store.list_runs(experiment_id=exp.id)
        assert runs and all(r.status is not RunStatus.PRUNED for r in runs)
        assert all(r.curve is not None and r.curve[-1][0] > 0.9 for r in runs)
    # The schedule change really was behind at the first check: only its category saved it.
    base = [r.curve for r in store.list_runs(experiment_id=1) if r.curve]
    crossing = store.list_runs(experiment_id=ids["WARMDOWN_FRAC"])[0]
    assert crossing.curve is not None and len(base) >= 2
    blind = check(loss_pairs(crossing.curve), [loss_pairs(c) for c in base], 0)
    assert blind.stop, blind
    assert crossing.metric is not None and crossing.metric < min(
        r.metric for r in store.list_runs(experiment_id=1) if r.metric is not None)


def test_prune_off_never_stops_a_run(tmp_path: Path) -> None:
    runtime, sweep, ids = night(tmp_path, "off", 1, [LOSING])
    store = runtime.store
    losing = store.get_experiment(ids["A_SHIFT"])
    assert losing.status is ExperimentStatus.DISCARDED
    assert not (losing.reason or "").startswith("stopped at ")
    runs = store.list_runs(sweep_id=sweep.id)
    assert runs and all(r.status is not RunStatus.PRUNED for r in runs)
    (run,) = store.list_runs(experiment_id=losing.id)
    assert run.curve is not None and run.curve[-1][0] > 0.9  # trained to the end
    assert run.metric is not None


def test_a_run_curve_is_bounded_and_keeps_the_steps() -> None:
    curve = RunCurve(bins=10)
    for i in range(1000):
        curve.add(i / 1000, 5.0 - i / 1000, float(i))
    curve.add(1.5, 1.0, 1500.0)  # past the budget: the last bin
    curve.add(float("nan"), 1.0, 1.0)  # ignored
    points = curve.points()
    assert len(points) == 10 and points[0][0] < points[-1][0]
    assert step_at(points, 0.5) == pytest.approx(500, abs=60)
    assert step_at(points, 0.0) is None  # before its first point
    assert PrunePolicy().checks[0] > points[0][0]
