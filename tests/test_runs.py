"""Runs as records, on real git, real subprocesses and a real SQLite file: the 0002 migration,
a sweep of null changes under the default rule, incumbent re-runs, and recovery of an orphaned
confirmation run after kill -9 of the process running the loop."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from conftest import REPO_ROOT, make_target
from foreground import run_sweep
from null_proposer import Ideas
from service_fixtures import wait_for

from agent.core.config import load_config
from agent.core.domain import ExperimentStatus, Proposal, RunRole, RunSpec, RunStatus
from agent.engine.recovery import recover
from agent.git.repo import GitRepo
from agent.ops.sweeps import create_sweep
from agent.proposers.knobs import make_diff
from agent.rules.run_records import recorded_best
from db.engine import make_engine, migrate, open_database
from db.store import SqlStore
from runner.groups import process_group_alive

NOISY = (Path(__file__).parent / "scripts" / "noisy_trainer.py").read_text()


def noisy_target(dest: Path, budget_s: float = 0.2, extra: str = "", train: str = NOISY) -> Path:
    toml = textwrap.dedent(f"""\
        [target]
        command   = "python train.py"
        editable  = ["train.py"]
        protected = ["prepare.py", "overnight.toml"]
        metric    = "val_bpb"
        budget_s  = {budget_s}
        timeout_s = 30
        """) + extra
    return make_target(dest, edits={"train.py": train, "overnight.toml": toml})


def test_null_sweep_keeps_at_most_one_change(tmp_path, store, make_loop):
    """20 null proposals, σ = 0.05, default settings: the keep rule keeps ≤ 1."""
    target = noisy_target(tmp_path / "noisy")
    sweep = create_sweep(store, GitRepo(target), target, name="null",
                         config=load_config(target), max_experiments=20)
    run_sweep(make_loop(target, Ideas()), sweep.name)
    exps = store.list_experiments(sweep.id)
    changes = [e for e in exps if not e.is_baseline]
    kept = [e for e in changes if e.status is ExperimentStatus.KEPT]
    runs = store.list_runs(sweep_id=sweep.id)
    print(f"null sweep: {len(kept)} of {len(changes)} null changes kept, {len(runs)} runs")
    assert len(changes) == 20 and len(kept) <= 1, [e.reason for e in kept]
    roles = [r.role for r in runs]
    assert roles[:5] == [RunRole.BASELINE] * 5  # σ̂ starts from five baseline runs
    # re-measured after 8 and 16 proposals, its runs beside changes counting
    assert roles.count(RunRole.INCUMBENT) >= 2
    periodic = [r for r in runs if r.role is RunRole.INCUMBENT and r.pair_run_id is None]
    assert len(periodic) <= 2
    odd = [(r.id, r.role.value, r.status.value, r.pgid, r.note, r.stop_fraction) for r in runs
           if not (r.pgid and r.status in (RunStatus.OK, RunStatus.SUSPECT))]
    assert not odd, odd
    # every experiment's metric is the best less its gain: the mean of its runs when they all
    # ran in the incumbent's usual condition (none suspect)
    for e in changes:
        mine = [r for r in runs if r.experiment_id == e.id and r.role is not RunRole.INCUMBENT
                and r.metric is not None]
        if mine and all(r.status is RunStatus.OK for r in mine):
            mean = sum(r.metric for r in mine) / len(mine)  # type: ignore[misc]
            assert abs(e.metric - mean) < 1e-9, (e.metric, mine, e.reason)
    # the sweep's best is the keep rule's record of it (recorded_best: the mean of the kept
    # commit's runs in its usual condition), its re-runs OK there and suspect elsewhere; its own
    # runs keep their verdict's status, so while those still agree with the conditions as they
    # stand (a busy machine's later runs can move them), the best is the mean of the OK runs
    best = store.get_sweep("null")
    value, good, off = recorded_best(store.run_metrics(sweep.id), best.best_commit or "")
    assert value is not None and abs(best.best_metric - value) < 1e-9, (best.best_metric, value)
    agree = [(r.status is RunStatus.SUSPECT) == o for r, o in zip(good, off, strict=True)]
    assert all(a for a, r in zip(agree, good, strict=True) if r.role is RunRole.INCUMBENT), (
        [(r.id, r.role, r.status, o) for r, o in zip(good, off, strict=True)])
    if all(agree):
        mine = [r.metric for r in good if r.status is RunStatus.OK]
        assert abs(best.best_metric - sum(mine) / len(mine)) < 1e-9, (best.best_metric, mine)


def test_slots_finishing_together_re_run_the_incumbent_once(tmp_path, store, make_loop):
    """8 proposals decided: the incumbent's re-run is due. Two slots check at once; the second
    checks while the first has claimed the re-run but not yet recorded it (held in its worktree
    set-up), and goes on without one: one re-run, not two."""
    # a loaded machine's jitter must not start incumbent runs beside changes here (they count
    # as re-runs): the test is about the periodic re-run's claim. The trainer reports its
    # budget as its training time, so every run has the same speed, and keeps none.
    steady = NOISY.replace('{trained:.3f}")', '{budget:.3f}")', 1)
    assert steady != NOISY
    target = noisy_target(tmp_path / "noisy", extra="discard_below = 100\n", train=steady)
    sweep = create_sweep(store, GitRepo(target), target, name="inc",
                         config=load_config(target), max_experiments=8)
    run_sweep(make_loop(target, Ideas()), sweep.name)
    assert not [r for r in store.list_runs(sweep_id=sweep.id) if r.role is RunRole.INCUMBENT]
    sweep = store.get_sweep("inc")
    head = GitRepo(target).head(sweep.branch)
    assert head == sweep.best_commit
    first, second = make_loop(target), make_loop(target)
    ea, eb = (store.add_experiment(sweep.id, Proposal(f"slot {k}", "")) for k in "ab")
    entered, release = threading.Event(), threading.Event()
    add_worktree = first.repo.add_worktree

    def held_add(path: Path, sha: str) -> None:
        entered.set()
        assert release.wait(60)
        add_worktree(path, sha)

    first.repo.add_worktree = held_add  # type: ignore[method-assign]
    slot = threading.Thread(target=first.incumbent.remeasure,
                            args=(sweep, ea, head, threading.Event()))
    slot.start()
    try:
        assert entered.wait(60)
        second.incumbent.remeasure(sweep, eb, head, threading.Event())
    finally:
        release.set()
        slot.join(60)
    roles = [r.role for r in store.list_runs(sweep_id=sweep.id)]
    assert roles.count(RunRole.INCUMBENT) == 1


class _GoodThenNull(Ideas):
    """First a change 10σ better (GOOD = 1), then null ones."""

    def propose(self, ctx):
        if self.k == 0:
            self.k += 1
            text = ctx.files["train.py"]
            return Proposal("good", make_diff("train.py", text, text.replace(
                "GOOD = 0", "GOOD = 1", 1)), self.name)
        return super().propose(ctx)


def test_one_best_the_kept_value_and_the_recorded_best_are_the_rules(tmp_path, store, make_loop):
    """A change 10σ better is kept on its second run (no keep on one run); its recorded value
    is the mean of its own runs (its record names them), and the recorded best is that
    commit's value by the one definition, re-read as its later runs come in."""
    steady = NOISY.replace('{trained:.3f}")', '{budget:.3f}")', 1)  # one speed: no runs beside
    good = steady.replace("IDEA = 0", "IDEA = 0\nGOOD = 0", 1).replace(
        "{1.0 + rng.gauss", "{1.0 - 0.5 * GOOD + rng.gauss", 1)
    assert good.count("GOOD") == 2
    target = noisy_target(tmp_path / "noisy", train=good, extra="incumbent_every = 1\n")
    sweep = create_sweep(store, GitRepo(target), target, name="best",
                         config=load_config(target), max_experiments=3)
    run_sweep(make_loop(target, _GoodThenNull()), sweep.name)
    exps = store.list_experiments(sweep.id)
    kept = exps[1]
    assert kept.status is ExperimentStatus.KEPT and kept.description == "good", kept.reason
    record = kept.record
    assert record is not None and record.n == 2 and record.p is not None and record.p <= 1.0
    runs = store.list_runs(sweep_id=sweep.id)
    own = [r for r in runs if r.experiment_id == kept.id and r.role is not RunRole.INCUMBENT]
    assert [r.id for r in own] == list(record.change.runs)  # the runs its value rests on
    assert len(own) == 2 and abs(kept.metric - sum(r.metric for r in own) / 2) < 1e-9
    mine = [r.metric for r in runs if r.commit == kept.commit and r.status is RunStatus.OK]
    assert len(mine) > 2  # re-run once every proposal here
    best = store.get_sweep("best")
    assert best.best_commit == kept.commit and abs(best.best_metric - sum(mine) / len(mine)) < 1e-9


DETERMINISTIC = """\
\"\"\"A trainer that ignores OVERNIGHT_SEED: every repeat prints the same metric.\"\"\"
import os
import time

GAIN_A = 0  # knobs: the change (a few lines apart: each diff applies on any head)
#
#
#
GAIN_B = 0
#
#
#
GAIN_C = 0
#
#
#
GAIN_D = 0
#
#
#
GAIN_E = 0
#
#
#
WORSE = 0
#
#
#
SAME = 0
#
#
#
NOISE = 0

budget = float(os.environ.get("OVERNIGHT_BUDGET_S", "0.2"))
time.sleep(budget)
metric = 1.0 - 0.015 * GAIN_A - 0.02 * GAIN_B - 0.03 * GAIN_C - 0.04 * GAIN_D - 0.045 * GAIN_E
metric += 0.02 * WORSE
print("---")
print(f"val_bpb:          {metric:.6f}")
print(f"training_seconds: {budget:.3f}")
print("num_steps:        40")
"""


def test_a_deterministic_night_keeps_every_clear_gain_on_one_run(tmp_path, store, make_loop):
    """A script that ignores its seed, changes queued as POST /experiments queues them: the
    baseline's five runs are identical, each change runs once, every gain is kept, the rest
    discarded, each keep says the noise was not measured, and nothing is re-run."""
    target = noisy_target(tmp_path / "det", train=DETERMINISTIC)
    sweep = create_sweep(store, GitRepo(target), target, name="det",
                         config=load_config(target), proposer="queue")
    text = (target / "train.py").read_text()
    knobs = ["GAIN_A", "WORSE", "GAIN_B", "GAIN_C", "SAME", "GAIN_D", "NOISE", "GAIN_E"]
    for knob in knobs:
        store.add_experiment(sweep.id, Proposal(f"{knob} = 1", make_diff(
            "train.py", text, text.replace(f"{knob} = 0", f"{knob} = 1", 1))))
    run_sweep(make_loop(target), sweep.name)
    exps = store.list_experiments(sweep.id)
    runs = store.list_runs(sweep_id=sweep.id)
    assert [r.role for r in runs[:5]] == [RunRole.BASELINE] * 5  # all identical
    assert len(runs) == 5 + 8  # one run a change
    changes = {e.description.split()[0]: e for e in exps if not e.is_baseline}
    kept = sorted(k for k, e in changes.items() if e.status is ExperimentStatus.KEPT)
    assert kept == ["GAIN_A", "GAIN_B", "GAIN_C", "GAIN_D", "GAIN_E"], {
        k: e.reason for k, e in changes.items()}
    for e in changes.values():
        assert len([r for r in runs if r.experiment_id == e.id]) == 1, e.reason
        assert "not measured" in (e.reason or "") and "OVERNIGHT_SEED" in (e.reason or "")
    assert not [r for r in runs if r.role is RunRole.INCUMBENT]
    best = store.get_sweep("det")
    assert abs(best.best_metric - (1.0 - 0.015 - 0.02 - 0.03 - 0.04 - 0.045)) < 1e-9


def test_an_incumbent_run_never_repeats_a_seed_the_commit_started(tmp_path, store, make_loop):
    """The keep rule sees only the incumbent's good runs; a run of it cut off by a kill (left
    interrupted, no metric) still used its seed: the run beside a change takes the next one,
    so nothing runs twice after a restart."""
    target = noisy_target(tmp_path / "noisy")
    sweep = create_sweep(store, GitRepo(target), target, name="seeds",
                         config=load_config(target), max_experiments=0)
    loop = make_loop(target, Ideas())
    run_sweep(loop, sweep.name)  # the baseline: seeds 42 to 46
    sweep = store.get_sweep("seeds")
    (base,) = store.list_experiments(sweep.id)
    cut = store.start_run(RunSpec(sweep.id, base.id, sweep.best_commit, 47, RunRole.INCUMBENT))
    assert [r.id for r in store.interrupt_running_runs()] == [cut.id]
    change = store.add_experiment(sweep.id, Proposal("a change", ""))
    run = loop.incumbent.run_paired(sweep, change, sweep.best_commit, threading.Event(), 47, None)
    assert run.status is RunStatus.OK and run.seed == 48
    seeds = [r.seed for r in store.list_runs(experiment_id=base.id)]
    assert sorted(seeds) == [42, 43, 44, 45, 46, 47, 48] and len(set(seeds)) == len(seeds)


def test_migration_from_0001_keeps_data_and_backfills_runs(tmp_path):
    db = tmp_path / "old.db"
    engine = make_engine(db)
    migrate(engine, "0001")  # the schema as that release left it
    con = sqlite3.connect(db)
    con.execute(
        "INSERT INTO sweeps (id, name, target_path, branch, status, proposer, config, "
        "protected_hashes, seed, min_delta, llm_tokens_in, llm_tokens_out, llm_usd, created_at,"
        " updated_at) VALUES (1, 'old', '/t', 'overnight/old', 'done', 'knobs', '{\"seed\": 7}', "
        "'{}', 7, 0, 0, 0, 0, '2026-11-01 00:00:00', '2026-11-01 00:00:00')")
    rows = [(1, 1, "kept", "aaa", 1.5, 111), (2, 0, "crashed", "bbb", None, 222),
            (3, 0, "queued", None, None, None)]
    for i, base, status, commit, metric, pgid in rows:
        summary = json.dumps({"val_bpb": metric, "training_seconds": 30.0} if metric else {})
        started = "'2026-11-01 01:00:00'" if commit else "NULL"
        con.execute(
            "INSERT INTO experiments (id, sweep_id, attempt, is_baseline, priority, proposer, "
            "description, diff, status, \"commit\", metric, summary, meta, pgid, log_path, "
            "llm_tokens_in, llm_tokens_out, llm_usd, created_at, run_started_at) VALUES "
            f"(?, 1, 0, ?, 0, 'knobs', 'd', '', ?, ?, ?, ?, '{{}}', ?, '/l/{i}.log', 0, 0, 0, "
            f"'2026-11-01 00:00:00', {started})", (i, base, status, commit, metric, summary, pgid))
    con.commit()
    con.close()

    migrate(engine)  # what every open does: upgrade to head
    store = SqlStore(open_database(db))
    assert [e.status.value for e in store.list_experiments(1)] == ["kept", "crashed", "queued"]
    assert store.get_experiment(1).metric == 1.5
    runs = store.list_runs(sweep_id=1)
    assert [(r.experiment_id, r.role, r.status, r.seed, r.pgid) for r in runs] == [
        (1, RunRole.BASELINE, RunStatus.OK, 7, 111), (2, RunRole.SCREEN, RunStatus.FAILED, 7, 222)]
    assert runs[0].metric == 1.5 and runs[0].training_s == 30.0 and runs[0].log_path == "/l/1.log"
    migrate(engine)  # idempotent: no second backfill
    assert len(store.list_runs()) == 2


HANGS_ON_CONFIRM = """\
import os, time
LR = 1
seed = int(os.environ["OVERNIGHT_SEED"])
if LR == 2 and seed != 42:  # the change's confirmation run hangs
    time.sleep(120)
print("---")
print(f"val_bpb: {(1.0 if LR == 1 else 0.5) + seed * 1e-4}")
"""

DRIVER = """\
import sys
from pathlib import Path
from agent.core.config import load_config
from agent.core.domain import Proposal
from agent.git.repo import GitRepo
from agent.engine.loop import Loop, LoopSettings
from foreground import run_sweep
from agent.ops.admission import admit, queue
from agent.ops.sweeps import create_sweep
from agent.executors.local import SubprocessRunner
from db.engine import open_database
from db.store import SqlStore

target, db, work, diff = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4]
store = SqlStore(open_database(db))
repo = GitRepo(target)
sweep = create_sweep(store, repo, target, name="k", config=load_config(target), proposer="queue")
queue(store, admit(store, repo, sweep, Proposal("lr 2", diff)))
run_sweep(Loop(store, repo, SubprocessRunner(grace_s=0.5), LoopSettings(work_dir=work)), "k")
"""


def test_recovery_kills_an_orphaned_confirmation_run(tmp_path):
    # Its metric moves with the seed, so σ̂ is measured and a better first run runs again.
    toml = ('[target]\ncommand = "python train.py"\neditable = ["train.py"]\n'
            'protected = ["overnight.toml"]\nmetric = "val_bpb"\nbudget_s = 1\ntimeout_s = 300\n')
    target = make_target(tmp_path / "t", edits={"train.py": HANGS_ON_CONFIRM,
                                                 "overnight.toml": toml})
    diff = make_diff("train.py", HANGS_ON_CONFIRM, HANGS_ON_CONFIRM.replace("LR = 1", "LR = 2"))
    db, work = tmp_path / "o.db", tmp_path / "work"
    argv = [sys.executable, "-c", DRIVER, str(target), str(db), str(work), diff]
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'tests'}"}
    service = subprocess.Popen(argv, cwd=REPO_ROOT, env=env)
    store = SqlStore(open_database(db))

    def confirming():
        runs = [r for r in store.list_runs() if r.role is RunRole.CONFIRM and r.pgid]
        return runs[0] if runs and process_group_alive(runs[0].pgid) else None

    try:
        run = wait_for(confirming, 120, "the confirmation run to start")
    finally:
        service.send_signal(signal.SIGKILL)
        service.wait(30)
    assert process_group_alive(run.pgid)  # orphaned: its service is gone

    report = recover(store, lambda s: GitRepo(target), work)
    # killed by its run id (OVERNIGHT_RUN_ID names the interrupted experiment) or its group
    assert run.pgid in report.killed_pids + report.killed_groups
    wait_for(lambda: not process_group_alive(run.pgid), 30, "the orphan to die")
    after = {r.id: r for r in store.list_runs()}
    assert after[run.id].status is RunStatus.INTERRUPTED
    exp = store.get_experiment(run.experiment_id)
    assert exp.status is ExperimentStatus.INTERRUPTED and store.retry_of(exp.id) is not None

