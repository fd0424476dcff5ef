"""Early stop of clearly losing runs in the real engine: a fake trainer with realistic curves
(tests/fixtures/curve_target) runs a short night on 1 and 4 slots; a clearly losing change is
stopped at a check and its process tree is gone, a null change and a crossing-curve schedule
change run to the end, and `prune = "off"` stops nothing."""

from __future__ import annotations

import difflib
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from service_fixtures import ServerProcess

from agent.core.domain import ExperimentStatus, Proposal, RunEnd, RunRole, RunSpec, RunStatus
from agent.core.record import Ending, StopPoint
from agent.engine.early_stop import EarlyStop, Reference, RunCurve, loss_pairs, step_at
from agent.engine.recovery import recover
from agent.engine.scheduler import SchedulerSettings, SlotScheduler
from agent.git.repo import init_repo
from agent.ops.sweeps import create_sweep
from agent.rules.decide import Rule, stop_level
from agent.rules.prune import PrunePolicy, check, matched
from overnight.runtime import Runtime
from runner.summary import ProgressPoint

LEVEL = 0.001  # a bar for the tests (agent.rules.decide.stop_level: 1 %/12 ≈ 8.3e-4)

CURVES = Path(__file__).parent / "fixtures" / "curve_target"
# Far past any margin: under load the line timings spread the incumbent's curves on the steep
# early part (margins of 0.29–0.37 at load 7, where 0.3 sat at the margin)
LOSING = ("A_SHIFT", "1.0", "a worse loss everywhere")
NULL = ("UNUSED", "1", "a knob that changes nothing")
# about +1.1 over the first quarter of the budget, −0.1 at the end: behind the first check's margin
# by far even when load spreads the incumbent's curves (at 0.5 it sat at the margin at load 7)
CROSSING = ("WARMDOWN_FRAC", "1.0", "warm-down: slower early, lower at the end")
# Worse everywhere and half the speed: its curve measures the machine, so it is not judged.
SLOW = ("A_SHIFT", "1.0", "a worse loss at half the speed", ("STEPS_PER_S", "100.0"))


def make_target(dest: Path, prune: str) -> Path:
    shutil.copytree(CURVES, dest, ignore=shutil.ignore_patterns("__pycache__"))
    toml = dest / "overnight.toml"
    toml.write_text(toml.read_text().replace('prune    = "auto"', f'prune    = "{prune}"'))
    init_repo(dest)
    return dest


def knob_diff(target: Path, name: str, value: str, *more: tuple[str, str]) -> str:
    old = (target / "train.py").read_text().splitlines(True)
    new = old
    for knob, v in ((name, value), *more):
        new = [f"{knob} = {v}" + line[line.index("  #"):] if line.startswith(f"{knob} = ")
               else line for line in new]
    assert new != old, name
    return "".join(difflib.unified_diff(old, new, "a/train.py", "b/train.py"))


def night(tmp: Path, prune: str, slots: int, changes: list[tuple]):  # type: ignore[no-untyped-def,type-arg]
    target = make_target(tmp / "target", prune)
    runtime = Runtime(tmp / "o.db")
    sweep = create_sweep(runtime.store, runtime.repo_at(target), target, name="n",
                         proposer="queue")
    ids = {what: runtime.store.add_experiment(
        sweep.id, Proposal(f"{name} = {value}: {what}", knob_diff(target, name, value, *more))).id
        for name, value, what, *more in changes}
    settings = SchedulerSettings(slots=slots, grace_s=1.0, poll_interval_s=0.1)
    SlotScheduler(runtime.store, settings, runtime.loop_factory(settings)).run_burst(["n"])
    return runtime, sweep, ids


def gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture(scope="module", params=[1, 4], ids=["1 slot", "4 slots"])
def auto_night(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp(f"night{request.param}")
    return (tmp, *night(tmp, "auto", request.param, [LOSING, NULL, SLOW, CROSSING]))


def test_a_clearly_losing_change_is_stopped_and_its_process_is_gone(auto_night) -> None:  # type: ignore[no-untyped-def]
    _, runtime, sweep, ids = auto_night
    store = runtime.store
    losing = store.get_experiment(ids[LOSING[2]])
    assert losing.status is ExperimentStatus.DISCARDED and losing.crash_kind is None
    assert losing.reason is not None and losing.reason.startswith("stopped at ")
    assert "of the budget: loss" in losing.reason and "the incumbent's" in losing.reason
    (run,) = store.list_runs(experiment_id=losing.id)  # no more runs after a stop
    assert run.status is RunStatus.PRUNED and run.role is RunRole.SCREEN
    assert run.note == losing.reason and run.metric is None
    assert run.pgid is not None and gone(run.pgid)
    assert run.curve is not None and run.curve[-1][0] < 1.0  # it did not train to the end
    assert run.training_s is not None and run.training_s < sweep.config.budget_s
    # 100 seed spreads worse from its first line (A_SHIFT 1.0, SEED_NOISE 0.01): stopped at the
    # first check, 25 % of its budget. Stopped is not crashed: the record keeps where it was
    # stopped, as the run recorded it
    assert run.stop_fraction == PrunePolicy().checks[0]
    record = losing.record
    assert record is not None and record.ending is Ending.STOPPED_EARLY
    assert record.stopped == StopPoint(run.id, run.stop_fraction, int(run.curve[-1][2]))


def test_a_null_and_a_crossing_change_run_to_the_end(auto_night) -> None:  # type: ignore[no-untyped-def]
    _, runtime, sweep, ids = auto_night
    store = runtime.store
    for what in (NULL[2], CROSSING[2]):
        exp = store.get_experiment(ids[what])
        assert exp.status in (ExperimentStatus.KEPT, ExperimentStatus.DISCARDED), exp
        assert not (exp.reason or "").startswith("stopped at ")
        runs = store.list_runs(experiment_id=exp.id)
        assert runs and all(r.status is not RunStatus.PRUNED for r in runs)
        assert all(r.curve is not None and r.curve[-1][0] > 0.9 for r in runs)
    # The schedule change really was behind at the first check: its category saved it, and
    # judged it would have gone on only as catching up; it ended better than every baseline run.
    base = store.list_runs(experiment_id=1)
    curves = [r.curve for r in base if r.curve]
    crossing = store.list_runs(experiment_id=ids[CROSSING[2]])[0]
    assert crossing.curve is not None and len(curves) >= 2
    blind = check(loss_pairs(crossing.curve), [loss_pairs(c) for c in curves], 0, LEVEL)
    assert blind.p_worse is not None and blind.p_worse <= LEVEL, blind
    assert not blind.stop and blind.why.startswith("behind but catching up: "), blind
    assert crossing.metric is not None
    assert crossing.metric < min(r.metric for r in base if r.metric is not None)


def test_a_change_whose_speed_departs_is_not_judged(auto_night) -> None:  # type: ignore[no-untyped-def]
    _, runtime, sweep, ids = auto_night
    store = runtime.store
    slow = store.get_experiment(ids[SLOW[2]])
    assert slow.status is ExperimentStatus.DISCARDED
    assert not (slow.reason or "").startswith("stopped at ")  # the keep rule discarded it
    (run,) = store.list_runs(experiment_id=slow.id)
    assert run.status is RunStatus.OK and run.curve is not None and run.curve[-1][0] > 0.9
    base = [r.curve for r in store.list_runs(experiment_id=1) if r.curve]
    ref = Reference(tuple(base), "hyperparameter", sweep.config.budget_s, LEVEL, 0.3)
    early = EarlyStop(ref, threading.Event())
    at = min(run.curve, key=lambda p: abs(p[0] - 0.3))
    ratio = early.speed_ratio(at[0], int(at[2]))
    assert ratio is not None and ratio == pytest.approx(0.5, abs=0.1)
    # As far behind as the losing change: only its speed kept it from being stopped.
    assert check(loss_pairs(run.curve), [loss_pairs(c) for c in base], 0, LEVEL).stop
    assert not check(loss_pairs(run.curve), [loss_pairs(c) for c in base], 0, LEVEL,
                     speed_off=True).stop


def test_each_run_is_listed_by_the_api_and_results_json(auto_night) -> None:  # type: ignore[no-untyped-def]
    tmp, runtime, sweep, ids = auto_night
    srv = ServerProcess(tmp / "o.db", log=tmp / "server.log", slots=0).start()
    try:
        with srv.client() as c:
            r = c.get(f"/experiments/{ids[LOSING[2]]}")
            assert r.status_code == 200, r.text
            (run,) = r.json()["run_records"]
            page = c.get("/experiments", params={"sweep": "n"}).json()
            html = c.get(f"/ui/experiments/{ids[LOSING[2]]}").text
            plain = c.get(f"/ui/experiments/{ids[NULL[2]]}").text
            assert c.get("/ui/sweeps/n").status_code == 200
    finally:
        srv.stop()
    assert run["status"] == "pruned" and run["role"] == "screen" and run["seed"] == 42
    assert run["stop_reason"] == r.json()["reason"] and run["metric"] is None
    assert run["training_seconds"] > 0 and run["throughput"] > 0
    assert all(e["run_records"] is None for e in page["data"])  # lists stay light
    # The dashboard draws the change's curve over the incumbent's band, and where it stopped.
    assert "Against the incumbent" in html and '<polygon class="band"' in html
    assert '<g class="stopped">' in html and "stopped at " in html
    assert '<polygon class="band"' in plain and '<g class="stopped">' not in plain
    cli = str(Path(sys.executable).with_name("overnight"))
    out = subprocess.run([cli, "results", "--sweep", "n", "--format", "json", "--db",
                          str(tmp / "o.db")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    night = json.loads(out.stdout)
    rows = {e["id"]: e for e in night["experiments"]}
    assert night["runs_by_status"]["pruned"]["n"] == 1
    assert 0 < night["runs_by_status"]["pruned"]["training_s"] < sweep.config.budget_s
    table = subprocess.run([cli, "results", "--sweep", "n", "--db", str(tmp / "o.db")],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "COLUMNS": "200"})
    assert table.returncode == 0 and "discarded" in table.stdout, table.stderr[-2000:]
    # stopped is not crashed: its own status in results.tsv and the table, with its point,
    # and no value (never 0.000000) nor delta
    losing = runtime.store.get_experiment(ids[LOSING[2]])
    point = losing.meta["verdict"]["stopped"]  # its record keeps where it was stopped
    at = (f"stopped early at {round(point['fraction'] * 100)} % of the budget "
          f"(step {point['step']})")
    tsv = subprocess.run([cli, "results", "--sweep", "n", "--format", "tsv", "--db",
                          str(tmp / "o.db")], capture_output=True, text=True, timeout=120)
    cells = next(line.split("\t") for line in tsv.stdout.splitlines()
                 if line.startswith((losing.commit or "")[:7]))
    assert cells[1] == "" and cells[3] == "stopped" and cells[4].endswith(f"[{at}]"), cells
    row = next(line for line in table.stdout.splitlines() if f"│ {losing.id} " in line)
    assert "stopped" in row and "0.000000" not in row and "+0" not in row, row
    assert [x["status"] for x in rows[ids[LOSING[2]]]["run_records"]] == ["pruned"]
    baseline = rows[1]["run_records"]
    # its own runs, and any incumbent run the keep rule ran beside a change (same commit)
    assert sum(x["role"] == "baseline" for x in baseline) >= 2
    assert {x["role"] for x in baseline} <= {"baseline", "incumbent"}
    assert all(x["status"] == "ok" and x["metric"] is not None for x in baseline)


def test_prune_off_never_stops_a_run(tmp_path: Path) -> None:
    runtime, sweep, ids = night(tmp_path, "off", 1, [LOSING])
    store = runtime.store
    losing = store.get_experiment(ids[LOSING[2]])
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


def test_a_restart_treats_a_pruned_run_as_finished(tmp_path: Path) -> None:
    """The service died after a run was stopped early but before its experiment was recorded:
    recovery records the change discarded with the stop's reason, and never runs it again."""
    target = make_target(tmp_path / "target", "auto")
    runtime = Runtime(tmp_path / "o.db")
    store = runtime.store
    sweep = create_sweep(store, runtime.repo_at(target), target, name="n", proposer="queue")
    exp = store.add_experiment(sweep.id, Proposal("A_SHIFT", knob_diff(target, *LOSING[:2])))
    assert store.claim(exp.id) is not None
    run = store.start_run(RunSpec(sweep.id, exp.id, "c0ffee", 42, RunRole.SCREEN))
    why = ("stopped at 25 % of the budget: loss 3.91 over 0–25 % vs the incumbent's 3.60 ± 0.01 "
           "there")
    store.end_run(run.id, RunEnd(RunStatus.PRUNED, note=why, training_s=0.4,
                                 curve=((0.1, 4.5, 20.0), (0.25, 3.9, 70.0))))
    def repo_of(s):  # type: ignore[no-untyped-def]
        return runtime.repo_at(Path(s.target_path))

    report = recover(store, repo_of, tmp_path / "o.db.work")
    assert report.interrupted == [exp.id] and report.requeued == {}
    follow = store.retry_of(exp.id)
    assert follow is not None and follow.status is ExperimentStatus.DISCARDED
    assert follow.reason == why
    queued = store.list_experiments(sweep.id, [ExperimentStatus.QUEUED])
    assert all(e.is_baseline for e in queued)  # only the baseline waits: no re-run of it
    (again,) = store.list_runs(experiment_id=exp.id)
    assert again.status is RunStatus.PRUNED
    assert again.curve == ((0.1, 4.5, 20.0), (0.25, 3.9, 70.0))
    again_report = recover(store, repo_of, tmp_path / "o.db.work")  # idempotent
    assert again_report.requeued == {} and store.retry_of(exp.id) == follow


def test_the_pruning_migration_keeps_old_runs_without_a_curve(tmp_path: Path) -> None:
    from sqlalchemy import text
    from test_store_contract import running, spec

    from db.engine import make_engine, migrate
    from db.store import SqlStore

    engine = make_engine(tmp_path / "old.db")
    try:
        migrate(engine, "holdout_confirm")  # the revision before run_pruning
        store = SqlStore(engine)
        sweep = store.create_sweep(spec())
        exp_id = running(store, sweep.id)
        with store.session("an old release's run") as s:
            s.execute(text(
                "INSERT INTO runs (sweep_id, experiment_id, \"commit\", seed, role, status, "
                "metric, summary, started_at) VALUES (:s, :e, 'c', 42, 'screen', 'ok', 1.5, "
                "'{}', '2026-11-29 00:00:00')"), {"s": sweep.id, "e": exp_id})
        migrate(engine)
        (old,) = store.list_runs(experiment_id=exp_id)
        assert old.curve is None and old.status is RunStatus.OK
        new = store.start_run(RunSpec(sweep.id, exp_id, "c", 43, RunRole.CONFIRM))
        store.end_run(new.id, RunEnd(RunStatus.PRUNED, note="stopped", curve=((0.3, 2.0, 9.0),)))
        assert store.list_runs(experiment_id=exp_id)[1].curve == ((0.3, 2.0, 9.0),)
        assert store.list_runs(experiment_id=exp_id)[1].note == "stopped"
    finally:
        engine.dispose()


def test_doctor_says_whether_the_early_stop_can_work(tmp_path: Path) -> None:
    from conftest import make_target as make_fake

    from agent.core.config import load_config
    from agent.ops.doctor import diagnose

    curves = make_target(tmp_path / "curves", "auto")
    (found,) = [c for c in diagnose(curves, load_config(curves), runs=1).checks
                if c.name == "early stop"]
    assert found.status == "ok" and 'prune = "auto": on' in found.detail
    fake = make_fake(tmp_path / "fake")  # three progress lines: too few for the checks
    (few,) = [c for c in diagnose(fake, load_config(fake), runs=1).checks
              if c.name == "early stop"]
    assert few.status == "info" and "3 progress lines" in few.detail


def test_the_early_stop_fit_check_names_what_is_missing() -> None:
    from agent.core.config import TargetConfig
    from agent.rules.contract import check_early_stop

    auto = TargetConfig(command="python t.py", editable=("t.py",), metric="m", budget_s=10,
                        prune="auto")
    off = auto.model_copy(update={"prune": "off"})
    assert check_early_stop(auto, 0, None).status == "warn"
    assert check_early_stop(off, 0, None).status == "info"
    # the default, not asked for: what the target lacks is a note, not a warning
    default = TargetConfig(command="python t.py", editable=("t.py",), metric="m", budget_s=10)
    assert default.prune == "auto" and check_early_stop(default, 0, None).status == "info"
    assert '(the default)' in check_early_stop(default, 0, None).detail
    assert "every 25%" in check_early_stop(auto, 3, 9.0).detail  # one line in each part
    assert "no elapsed time" in check_early_stop(auto, 100, None).detail
    assert check_early_stop(auto, 100, 2.0).status == "warn"  # elapsed reaches 20 %
    assert check_early_stop(off, 100, 9.9).status == "ok"
    assert 'set prune = "auto"' in check_early_stop(off, 100, 9.9).detail


def _curve(shift: float, seed: int) -> tuple[tuple[float, float, float], ...]:
    rng = random.Random(seed)
    off = rng.gauss(0, 0.01)
    return tuple((f / 100, 3 + 2 * math.exp(-f / 25) + shift + off, float(f * 10))
                 for f in range(1, 101))


def _fed(early: EarlyStop, shift: float) -> EarlyStop:
    for f, loss, step in _curve(shift, 99):
        early.add(f, ProgressPoint(int(step), loss, None))
        if early.stop.is_set():
            break
    return early


def test_a_run_a_little_behind_goes_on_and_one_clearly_behind_is_stopped() -> None:
    """The stop is the keep rule's test mirrored: a run a little behind is not clearly worse."""
    base = tuple(_curve(0.0, s) for s in range(4))
    little = _fed(EarlyStop(Reference(base, "hyperparameter", 10.0, LEVEL, 0.3),
                            threading.Event()), 0.01)
    assert little.stopping_check is None and not little.stop.is_set() and len(little.checks) == 3
    behind = _fed(EarlyStop(Reference(base, "hyperparameter", 10.0, LEVEL, 0.3),
                            threading.Event()), 0.5)
    assert behind.stopping_check is not None and behind.stop.is_set()


def test_a_run_ten_spreads_worse_from_its_first_line_stops_at_the_first_check() -> None:
    """Through the engine's early stop, fed progress lines, at the engine's bar (the default
    rule's) against the default baseline's 5 curves: 10 times their spread worse over the first
    quarter is stopped there, and no later check is made."""
    base = tuple(_curve(0.0, s) for s in range(5))
    part = PrunePolicy().part(0)
    m = matched(loss_pairs(_curve(0.0, 99)), [loss_pairs(c) for c in base], part)
    here, own = m.incumbents, m.loss or math.nan
    shift = statistics.fmean(here) - own + 10 * statistics.stdev(here)
    early = _fed(EarlyStop(Reference(base, "hyperparameter", 10.0, stop_level(Rule()), 0.3),
                           threading.Event()), shift)
    assert early.stop.is_set() and early.stopping_check is not None
    assert early.stopping_check.fraction == 0.25 and len(early.checks) == 1
    assert early.stopping_check.p_worse is not None
    assert early.stopping_check.p_worse <= stop_level(Rule())


def test_the_keys_of_the_earlier_rule_are_refused_with_what_replaced_them() -> None:
    from agent.core.config import parse_config
    from agent.core.errors import ConfigError

    table = {"command": "python t.py", "editable": ["t.py"], "metric": "m", "budget_s": 10}
    for key, value in (("futility", 0.5), ("keep_z", 1.75), ("discard_z", 0.6)):
        with pytest.raises(ConfigError, match=f"{key}: no longer a setting: .*fdr"):
            parse_config({**table, key: value})


def test_a_run_stopped_on_a_budget_of_steps_keeps_the_seconds_it_trained() -> None:
    """No summary (it never finished) and no time budget to take a share of: the seconds are its
    last line's elapsed ones, not 0 (a night's training seconds would otherwise undercount)."""
    from agent.engine.attempt import pruned_end

    base = tuple(_curve(0.0, s) for s in range(4))
    early = EarlyStop(Reference(base, "hyperparameter", 10.0, LEVEL, 0.3), threading.Event())
    for f, loss, step in _curve(0.5, 99):
        early.add(f, ProgressPoint(int(step), loss, round(f * 40, 1)))
        if early.stop.is_set():
            break
    assert early.stopping_check is not None
    end = pruned_end(RunEnd(RunStatus.FAILED), early, None)
    assert end.status is RunStatus.PRUNED and end.training_s == pytest.approx(
        early.curve.last_fraction * 40, abs=0.05)
    silent = EarlyStop(Reference(base, "hyperparameter", 10.0, LEVEL, 0.3), threading.Event())
    for f, loss, step in _curve(0.5, 99):
        silent.add(f, ProgressPoint(int(step), loss, None))
        if silent.stop.is_set():
            break
    assert pruned_end(RunEnd(RunStatus.FAILED), silent, None).training_s is None  # unknown
    assert pruned_end(RunEnd(RunStatus.FAILED), silent, 40.0).training_s == pytest.approx(
        silent.curve.last_fraction * 40)  # a time budget's share
