"""The early stop right after a keep, in the real engine: the new incumbent has its 2 runs, and its
first challenger is judged on the spread pooled with the earlier incumbent's curves
(agent.engine.early_stop.earlier_curves), against the new incumbent's own level. The target here
turns re-runs off (`incumbent_every = 0`) so its first challenger meets it with its 2 runs."""

from __future__ import annotations

import shutil
from pathlib import Path

from test_early_stop import knob_diff

from agent.core.domain import ExperimentStatus, Proposal, RunStatus
from agent.engine.early_stop import earlier_curves, loss_pairs
from agent.engine.scheduler import SchedulerSettings, SlotScheduler
from agent.git.repo import init_repo
from agent.ops.sweeps import create_sweep
from agent.rules.prune import check
from overnight.runtime import Runtime

LEVEL = 0.001  # a bar for the tests (agent.rules.decide.stop_level: 1 %/12 ≈ 8.3e-4)

CURVES = Path(__file__).parent / "fixtures" / "curve_target"
FIRST = ("SHIFT_FIRST", "-0.3", "a first gain")
GAIN = ("SHIFT_GAIN", "-0.3", "a better loss everywhere")
LOSING = ("SHIFT_LOSE", "0.6", "a worse loss everywhere")


def make_target(dest: Path) -> Path:
    shutil.copytree(CURVES, dest, ignore=shutil.ignore_patterns("__pycache__"))
    toml = dest / "overnight.toml"
    toml.write_text(toml.read_text() + "incumbent_every = 0  # no incumbent re-runs\n")
    train = (dest / "train.py").read_text()
    knobs = "".join(f"{k} = 0.0  # knobs: shift\n" + "#\n" * 4
                    for k in (FIRST[0], GAIN[0], LOSING[0]))
    (dest / "train.py").write_text(train.replace("SEED_NOISE = ", knobs + "SEED_NOISE = ", 1))
    init_repo(dest)
    return dest


def test_the_first_challenger_after_a_keep_is_judged(tmp_path: Path) -> None:
    target = make_target(tmp_path / "target")
    runtime = Runtime(tmp_path / "o.db")
    store = runtime.store
    sweep = create_sweep(store, runtime.repo_at(target), target, name="n", proposer="queue")
    ids = [store.add_experiment(sweep.id, Proposal(f"{n} = {v}: {what}",
                                                   knob_diff(target, n, v))).id
           for n, v, what in (FIRST, GAIN, LOSING)]
    settings = SchedulerSettings(slots=1, grace_s=1.0, poll_interval_s=0.1)
    SlotScheduler(store, settings, runtime.loop_factory(settings)).run_burst(["n"])
    first, gain, losing = (store.get_experiment(i) for i in ids)
    assert first.status is gain.status is ExperimentStatus.KEPT, (first.reason, gain.reason)
    assert losing.status is ExperimentStatus.DISCARDED
    assert losing.reason is not None and losing.reason.startswith("stopped at 25 % "), losing
    (run,) = store.list_runs(experiment_id=losing.id)
    assert run.status is RunStatus.PRUNED and run.curve is not None
    # when it ran, the new incumbent had its own 2 runs (the earlier ones theirs)
    mine = [r for r in store.list_runs(sweep_id=sweep.id)
            if r.commit == gain.commit and r.id < run.id and r.status is RunStatus.OK]
    assert len(mine) == 2 and all(r.curve for r in mine)
    before, base = earlier_curves(store, sweep.id, gain.commit)  # every earlier one, newest first
    assert len(before) == len([r for r in store.list_runs(experiment_id=first.id)
                               if r.commit == first.commit and r.status is RunStatus.OK])
    assert len(before) >= 2 and len(base) >= 3
    # alone, the new incumbent's 2 curves calibrate nothing: the blind spot this closes
    theirs = [loss_pairs(r.curve) for r in mine if r.curve]
    alone = check(loss_pairs(run.curve), theirs, 0, LEVEL)
    pooled = check(loss_pairs(run.curve), theirs, 0, LEVEL,
                   earlier=[[loss_pairs(c) for c in g] for g in (before, base)])
    assert pooled.stop and alone.se != pooled.se  # pooled: more degrees of freedom
    # 0.6 behind the new incumbent (level with the baseline): the level is the new incumbent's
    assert pooled.reference is not None and pooled.loss is not None
    assert 0.45 < pooled.loss - pooled.reference < 0.75


def test_earlier_curves_are_each_kept_commit_but_the_incumbent(tmp_path: Path) -> None:
    target = make_target(tmp_path / "target")
    runtime = Runtime(tmp_path / "o.db")
    store = runtime.store
    sweep = create_sweep(store, runtime.repo_at(target), target, name="n", proposer="queue")
    settings = SchedulerSettings(slots=1, grace_s=1.0, poll_interval_s=0.1)
    SlotScheduler(store, settings, runtime.loop_factory(settings)).run_burst(["n"])
    (baseline,) = store.list_experiments(sweep.id)
    assert baseline.is_baseline and baseline.commit is not None
    (group,) = earlier_curves(store, sweep.id, "another commit")
    assert len(group) == len([r for r in store.list_runs(experiment_id=baseline.id)
                              if r.status is RunStatus.OK])
    assert earlier_curves(store, sweep.id, baseline.commit) == []
