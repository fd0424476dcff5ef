"""The Slurm executor on a real one-node Slurm cluster (tests/slurm_cluster.py: munged,
slurmctld and slurmd as root, on loopback).

Runs go through the real engine (SlotScheduler in burst mode, or the `overnight` console
script), real git worktrees, real SQLite and real sbatch/squeue/scancel/scontrol. Covered:
keep/discard/tamper results equal to the local executor's on the same proposals, a timeout, a
cancel (scancel), a job Slurm requeues (run again, not blamed), a kill -9 of the service while
jobs run (adopted by the retries, not submitted again), the refusals at the start, and a job
sbatch refuses (not started: the sweep pauses, saying why, and nothing blames the script). No
assertion is about wall-clock time: each waits on a state.
"""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from agent.core.domain import Experiment, ExperimentStatus, Proposal, RunStatus, Sweep
from agent.core.record import Ending
from agent.engine.attempt import run_id_prefix
from agent.engine.scheduler import SchedulerSettings, SlotScheduler
from agent.executors.slurm import RUN_ID_PREFIX, work_key
from agent.executors.slurm_cli import JobState, jobs
from agent.git.repo import init_repo
from agent.ops.sweeps import create_sweep
from overnight.runtime import Runtime
from runner.reaper import pids_with_env
from runner.tree import RUN_ID_ENV

pytestmark = pytest.mark.slow
T = TypeVar("T")

TRAIN = '''"""Fake trainer for the Slurm tests: the real output contract, MODE picks a behaviour."""
import os
import time

MODE = "normal"  # normal | forever | hold (until RELEASE exists) | hold-changes (but the
# baseline, until RELEASE or RELEASE-<X> exists) | tamper
RELEASE = {release!r}
K1 = 0
#
#
#
K2 = 0
#
#
#
K3 = 0
X = K1 + K2 + K3
data = open("data/tokens.txt").read().strip()  # an asset outside git, linked in
print(f"step 1 | loss 2.0 | elapsed 0.1s | data {{data}}", flush=True)
if MODE == "forever":
    while True:
        time.sleep(0.2)
while MODE == "hold" and not os.path.exists(RELEASE):
    time.sleep(0.1)
while (MODE == "hold-changes" and os.environ["OVERNIGHT_EXPERIMENT_ID"] != "1"
       and not os.path.exists(RELEASE)
       and not os.path.exists(f"{{RELEASE}}-{{X}}")):
    time.sleep(0.1)
if MODE == "tamper":
    with open("prepare.py", "a") as fh:
        fh.write("# changed by the run\\n")
print("step 2 | loss 1.0 | elapsed 0.2s", flush=True)
print("---")
print(f"val_bpb: {{1.0 - 0.001 * X:.6f}}")
print("training_seconds: 0.2")
'''
TOML = '''[target]
command = "python train.py"
editable = ["train.py"]
protected = ["prepare.py"]
assets = ["data"]
metric = "val_bpb"
budget_s = 1
timeout_s = {timeout}
'''
PROPOSALS = [("tamper", 'MODE = "normal"', 'MODE = "tamper"'),
             ("K1 helps", "K1 = 0\n", "K1 = 1\n"), ("K2 hurts", "K2 = 0\n", "K2 = -1\n"),
             ("K3 helps", "K3 = 0\n", "K3 = 2\n")]
OVERNIGHT = str(Path(sys.executable).parent / "overnight")
NO_GPUS = ["--executor", "slurm", "--slurm-gpus", "0"]  # the test node has none


def make_target(path: Path, release: Path, timeout: float = 30, mode: str = "normal") -> str:
    path.mkdir(parents=True)
    train = TRAIN.format(release=str(release))
    (path / "train.py").write_text(train.replace('MODE = "normal"', f'MODE = "{mode}"'))
    (path / "prepare.py").write_text('"""The protected harness."""\n')
    (path / "overnight.toml").write_text(TOML.format(timeout=timeout))
    (path / ".gitignore").write_text("data/\n")
    (path / "data").mkdir()
    (path / "data" / "tokens.txt").write_text("hello\n")
    init_repo(path)
    return train


def diff(train: str, old: str, new: str) -> str:
    after = train.replace(old, new)
    assert after != train
    return "".join(difflib.unified_diff(train.splitlines(True), after.splitlines(True),
                                        "a/train.py", "b/train.py"))


def night(tmp: Path, executor: str, proposals: list[tuple[str, str, str]], timeout: float = 30,
          slots: int = 1) -> tuple[Runtime, Sweep, SlotScheduler]:
    train = make_target(tmp / "target", tmp / "release", timeout)
    runtime = Runtime(tmp / "o.db")
    sweep = create_sweep(runtime.store, runtime.repo_at(tmp / "target"), tmp / "target",
                         name="n", proposer="queue")
    for description, old, new in proposals:
        runtime.store.add_experiment(sweep.id, Proposal(description, diff(train, old, new)))
    chosen = SchedulerSettings(slots=slots, executor=executor, grace_s=0.5,
                               poll_interval_s=0.1, slurm_gpus=0)
    runtime.recover(chosen)  # as every engine's start does (and the executor's check)
    engine = SlotScheduler(runtime.store, chosen, runtime.loop_factory(chosen))
    return runtime, sweep, engine


def wait_until(condition: Callable[[], T | None], what: str, timeout_s: float = 120) -> T:
    """Poll a state; the deadline only bounds a hang."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def our_jobs(work_dir: Path) -> dict[str, JobState]:
    """Every Slurm job this work dir submitted (finished ones stay listed: MinJobAge)."""
    return dict(jobs(f"overnight-{work_key(work_dir)}-"))


def leftovers(work_dir: Path, exp_id: int) -> set[int]:
    """Processes on this machine (the cluster's node) carrying the experiment's run id."""
    return pids_with_env(RUN_ID_ENV, RUN_ID_PREFIX + run_id_prefix(work_dir, exp_id),
                         prefix=True)


def outcomes(runtime: Runtime, sweep: Sweep) -> list[tuple[str, str, float | None, str]]:
    return [(e.description, e.status.value, e.metric, e.crash_kind.value if e.crash_kind else "")
            for e in runtime.store.list_experiments(sweep.id)]


def running_change(runtime: Runtime, sweep: Sweep) -> Experiment | None:
    return next((e for e in runtime.store.list_experiments(sweep.id)
                 if not e.is_baseline and e.status is ExperimentStatus.RUNNING), None)


def shown_everywhere(db: Path, exp_id: int, job_ids: list[str | None]) -> None:
    """The runs' Slurm jobs in `results --format json`, the MCP tools and the dashboard."""
    from browser_helpers import make_app
    from fastapi.testclient import TestClient

    from api.mcp.tools import AgentTools

    out = subprocess.run([OVERNIGHT, "results", "--sweep", "n", "--format", "json", "--db",
                          str(db)], capture_output=True, text=True, timeout=120, check=True)
    (row,) = [e for e in json.loads(out.stdout)["experiments"] if e["id"] == exp_id]
    assert [r["slurm_job_id"] for r in row["run_records"]] == job_ids
    runtime = Runtime(db)
    try:
        result = AgentTools(runtime.service).experiment_result(exp_id)
        assert [r.slurm_job_id for r in result.run_records or []] == job_ids
    finally:
        runtime.close()
    with TestClient(make_app(db)) as client:
        page = client.get(f"/ui/experiments/{exp_id}").text
    assert "<th scope=\"col\">Slurm job</th>" in page
    assert all(f'<td class="mono">{j}</td>' in page for j in job_ids)


def live_card_job(db: Path, exp_id: int) -> str | None:
    """The Slurm job the dashboard's live card shows for a running experiment."""
    from browser_helpers import make_app
    from fastapi.testclient import TestClient

    with TestClient(make_app(db)) as client:
        live = client.get(f"/ui/experiments/{exp_id}/tail").json()
        page = client.get(f"/ui/experiments/{exp_id}").text
    assert f'Slurm job <span class="mono">{live["slurm_job_id"]}</span>' in page
    return live["slurm_job_id"]


def test_results_through_slurm_equal_the_local_executors(slurm_cluster, tmp_path):
    results, tampered = {}, {}
    for executor in ("local", "slurm"):
        runtime, sweep, engine = night(tmp_path / executor, executor, PROPOSALS)
        engine.run_burst(["n"])
        results[executor] = outcomes(runtime, sweep)
        exps = runtime.store.list_experiments(sweep.id)
        tampered[executor] = exps[1].reason or ""
        log = Path(exps[2].log_path or "").read_text()
        assert "data hello" in log and "val_bpb: 0.999000" in log  # the log came back
        runs = runtime.store.list_runs(sweep_id=sweep.id)
        if executor == "slurm":  # one job per run, each recorded, none left behind
            ids = [r.slurm_job_id for r in runs]
            assert None not in ids and len(set(ids)) == len(ids), ids
            listed = our_jobs(runtime.work_dir)
            assert set(listed) == set(ids), (listed, ids)
            assert {s.state for s in listed.values()} == {"COMPLETED"}
            assert all(r.pgid is None for r in runs)
            assert not list((runtime.work_dir / "slurm").iterdir())  # job folders removed
            shown_everywhere(tmp_path / executor / "o.db", exps[2].id, [
                r.slurm_job_id for r in runs if r.experiment_id == exps[2].id])
        runtime.close()
    assert results["slurm"] == results["local"]
    statuses = [s for _, s, _, _ in results["slurm"]]
    assert statuses == ["kept", "crashed", "kept", "discarded", "kept"], results["slurm"]
    assert "prepare.py" in tampered["slurm"] and tampered["slurm"] == tampered["local"]


def test_a_run_past_its_deadline_is_killed_in_its_job(slurm_cluster, tmp_path):
    runtime, sweep, engine = night(tmp_path, "slurm", [("forever", 'MODE = "normal"',
                                                        'MODE = "forever"')], timeout=3)
    engine.run_burst(["n"])
    exps = runtime.store.list_experiments(sweep.id)
    assert [e.status for e in exps] == [ExperimentStatus.KEPT, ExperimentStatus.TIMEOUT]
    assert "data hello" in Path(exps[1].log_path or "").read_text()
    assert not leftovers(runtime.work_dir, exps[1].id)
    job = runtime.store.list_runs(experiment_id=exps[1].id)[0].slurm_job_id
    assert our_jobs(runtime.work_dir)[job].state == "COMPLETED"
    runtime.close()


def test_a_cancel_is_a_scancel_that_ends_the_jobs_process_tree(slurm_cluster, tmp_path):
    runtime, sweep, engine = night(tmp_path, "slurm", [("forever", 'MODE = "normal"',
                                                        'MODE = "forever"')])
    burst = threading.Thread(target=engine.run_burst, args=(["n"],), daemon=True)
    burst.start()
    exp = wait_until(lambda: running_change(runtime, sweep), "the long run to start")
    log = Path(wait_until(lambda: runtime.store.get_experiment(exp.id).log_path,
                          "its log"))
    wait_until(lambda: log.exists() and "data hello" in log.read_text(), "its first line, live")
    assert leftovers(runtime.work_dir, exp.id)
    live_job = live_card_job(tmp_path / "o.db", exp.id)
    assert live_job and live_job == runtime.store.list_runs(experiment_id=exp.id)[0].slurm_job_id
    assert engine.cancel(exp.id)
    burst.join(120)
    assert not burst.is_alive()
    done = runtime.store.get_experiment(exp.id)
    assert done.status is ExperimentStatus.CANCELLED
    assert not leftovers(runtime.work_dir, done.id)
    run = runtime.store.list_runs(experiment_id=done.id)[0]
    assert run.status is RunStatus.CANCELLED
    assert "data hello" in Path(run.log_path or "").read_text()
    job = run.slurm_job_id or ""
    assert wait_until(lambda: our_jobs(runtime.work_dir)[job].state in ("CANCELLED", "COMPLETED"),
                      "the job's end")
    runtime.close()


def test_a_job_slurm_requeues_runs_again_and_is_not_blamed(slurm_cluster, tmp_path):
    runtime, sweep, engine = night(tmp_path, "slurm", [("hold", 'MODE = "normal"',
                                                        'MODE = "hold"')])
    burst = threading.Thread(target=engine.run_burst, args=(["n"],), daemon=True)
    burst.start()
    store = runtime.store
    exp = wait_until(lambda: running_change(runtime, sweep), "the held run to start")
    wait_until(lambda: leftovers(runtime.work_dir, exp.id), "its process in the job")
    job = wait_until(lambda: store.list_runs(experiment_id=exp.id)[0].slurm_job_id,
                     "its job id")
    slurm_cluster.run("scontrol", "requeue", str(job))
    retry = wait_until(lambda: store.retry_of(exp.id), "the re-queue")
    (tmp_path / "release").write_text("go")  # the retry's own job may finish
    burst.join(180)
    assert not burst.is_alive()
    lost = store.get_experiment(exp.id)
    assert lost.status is ExperimentStatus.INTERRUPTED and lost.crash_kind is None
    assert f"Slurm requeued job {job}" in (lost.reason or ""), lost.reason
    again = store.get_experiment(retry.id)
    assert again.status is ExperimentStatus.DISCARDED and again.metric == 1.0, again.reason
    (first,), (second,) = (store.list_runs(experiment_id=e) for e in (lost.id, again.id))
    assert first.status is RunStatus.INTERRUPTED and second.status is RunStatus.OK
    assert second.slurm_job_id != job
    requeued = wait_until(lambda: our_jobs(runtime.work_dir)[job].state == "CANCELLED",
                          "the requeued copy cancelled")
    assert requeued  # it did not run a second time beside the retry's own job
    runtime.close()


def test_a_kill_9_of_the_service_leaves_its_jobs_to_the_retries(slurm_cluster, tmp_path):
    """Two jobs run when `overnight run` is killed with SIGKILL: they go on in Slurm, the next
    start re-queues their experiments once, and each retry adopts its job (the same job id on
    both runs); no job is submitted twice and none is left."""
    from db.location import DbLocation

    make_target(tmp_path / "target", tmp_path / "release", mode="hold-changes")
    db = tmp_path / "o.db"
    work = DbLocation.parse(db.resolve()).default_work_dir()
    argv = [OVERNIGHT, "run", "--target", str(tmp_path / "target"), "--sweep", "s",
            "--experiments", "2", "--slots", "2", *NO_GPUS, "--db", str(db)]
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: sum(s.state == "RUNNING" for s in our_jobs(work).values()) == 2,
                   "two held changes' jobs running")
    finally:
        first.kill()
        first.wait()
    resumed = subprocess.Popen([*argv, "--resume"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    runtime = Runtime(db)
    try:
        store = runtime.store

        def adopted() -> bool:
            retries = [e for e in store.list_experiments() if e.retry_of is not None]
            return len(retries) == 2 and all(
                any(r.slurm_job_id for r in store.list_runs(experiment_id=e.id))
                for e in retries)

        wait_until(adopted, "both retries running their adopted jobs")
        (tmp_path / "release").write_text("go")
        out, _ = resumed.communicate(timeout=240)
        assert resumed.returncode == 0, out
        exps = store.list_experiments()
        runs = store.list_runs()
        for lost in (e for e in exps if e.status is ExperimentStatus.INTERRUPTED):
            retry = store.retry_of(lost.id)
            assert retry is not None and retry.status.is_finished()
            assert retry.status is not ExperimentStatus.INTERRUPTED, retry.reason
            (cut,) = [r for r in runs if r.experiment_id == lost.id]
            mine = [r for r in runs if r.experiment_id == retry.id]
            assert cut.status is RunStatus.INTERRUPTED and mine[0].status is RunStatus.OK
            assert mine[0].slurm_job_id == cut.slurm_job_id  # adopted, not submitted again
        assert sum(e.status is ExperimentStatus.INTERRUPTED for e in exps) == 2
        listed = our_jobs(work)
        recorded = {r.slurm_job_id for r in runs}
        assert set(listed) == recorded, (listed, recorded)  # every job submitted is a run's
        assert all(s.state == "COMPLETED" for s in listed.values())
        assert not list((work / "slurm").iterdir()) and not list(
            (work / "worktrees").rglob("exp-*"))
    finally:
        if resumed.poll() is None:
            resumed.kill()
        runtime.close()


def test_a_left_job_whose_change_now_runs_on_a_new_head_is_cancelled(slurm_cluster, tmp_path):
    """Killed with two changes' jobs running; the first ends while the service is down. The
    restart's one slot adopts its result and keeps it, so the second change's retry is built
    on the new head: the job it left (the old head's code) is cancelled at once, never
    adopted, and the change runs again as a new job."""
    from db.location import DbLocation

    make_target(tmp_path / "target", tmp_path / "release", mode="hold-changes")
    db = tmp_path / "o.db"
    work = DbLocation.parse(db.resolve()).default_work_dir()
    queue_changes(tmp_path / "target", db, [("K1 helps", "K1 = 0\n", "K1 = 1\n"),
                                            ("K3 helps", "K3 = 0\n", "K3 = 2\n")])
    argv = [OVERNIGHT, "run", "--target", str(tmp_path / "target"), "--sweep", "n", "--resume",
            *NO_GPUS, "--db", str(db)]
    first = subprocess.Popen([*argv, "--slots", "2"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: sum(s.state == "RUNNING" for s in our_jobs(work).values()) == 2,
                   "both changes' jobs running")
    finally:
        first.kill()
        first.wait()
    runtime = Runtime(db)
    try:
        store = runtime.store
        (kept_job,), (left_job,) = ([r.slurm_job_id for r in store.list_runs(experiment_id=e)]
                                    for e in (2, 3))
        (tmp_path / "release-1").write_text("go")  # the first change's job ends meanwhile
        wait_until(lambda: our_jobs(work)[kept_job].state == "COMPLETED", "its job's end")
        resumed = subprocess.Popen([*argv, "--slots", "1"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        wait_until(lambda: our_jobs(work)[left_job].state == "CANCELLED",
                   "the old head's job cancelled")
        (tmp_path / "release").write_text("go")
        out, _ = resumed.communicate(timeout=240)
        assert resumed.returncode == 0, out
        first_retry, second_retry = (store.retry_of(e) for e in (2, 3))
        assert first_retry is not None and second_retry is not None
        assert first_retry.status is ExperimentStatus.KEPT
        assert store.list_runs(experiment_id=first_retry.id)[0].slurm_job_id == kept_job
        again = store.list_runs(experiment_id=second_retry.id)
        assert again and left_job not in {r.slurm_job_id for r in again}
        second_retry = store.get_experiment(second_retry.id)
        assert second_retry.status.is_finished(), second_retry.status
        assert second_retry.base_commit == first_retry.commit  # built on the kept change
        listed = our_jobs(work)
        assert set(listed) == {r.slurm_job_id for r in store.list_runs()}
        assert not any(s.alive for s in listed.values())
        assert not list((work / "slurm").iterdir()) and not list(
            (work / "worktrees").rglob("exp-*"))
    finally:
        runtime.close()


def queue_changes(target: Path, db: Path, changes: list[tuple[str, str, str]]) -> None:
    """A sweep `n` of these changes (proposer: the queue), for `overnight run --resume`."""
    runtime = Runtime(db)
    try:
        train = (target / "train.py").read_text()
        sweep = create_sweep(runtime.store, runtime.repo_at(target), target, name="n",
                             proposer="queue")
        for description, old, new in changes:
            runtime.store.add_experiment(sweep.id, Proposal(description, diff(train, old, new)))
    finally:
        runtime.close()


def test_a_site_the_nodes_cannot_share_is_refused_at_the_start(slurm_cluster, tmp_path):
    make_target(tmp_path / "target", tmp_path / "release")
    bad = [(["--slurm-partition", "faraway"], "cannot see"),
           (["--devices", "0"], "--devices is for the local executor"),
           (["--slurm-option=mem=4G"], "expected one sbatch option")]
    for args, message in bad:
        proc = subprocess.run([OVERNIGHT, "run", "--target", str(tmp_path / "target"), "--db",
                               str(tmp_path / "o.db"), *NO_GPUS, *args], capture_output=True,
                              text=True, timeout=60, check=False)
        assert proc.returncode != 0 and message in proc.stdout + proc.stderr, (args, proc)
    proc = subprocess.run([OVERNIGHT, "run", "--target", str(tmp_path / "target"), "--db",
                           str(tmp_path / "o.db"), "--slurm-qos", "high"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "need --executor slurm" in proc.stderr, proc.stderr


def test_a_job_its_node_cannot_run_pauses_the_sweep_with_the_jobs_output(
        slurm_cluster, tmp_path, monkeypatch):
    """A job that ends without its half writing a result (here: the interpreter is not there
    on the node) is the site's problem, not the change's: the sweep pauses, naming the job and
    quoting its output."""
    from agent.core.domain import SweepStatus
    from agent.executors import slurm_follow

    monkeypatch.setattr(slurm_follow, "RESULT_WAIT_S", 1.0)  # a local disk: no cache to wait out
    runtime, sweep, engine = night(tmp_path, "slurm", [])
    runtime.slurm_executor(engine.settings).python = "/nonexistent/bin/python3"
    engine.run_burst(["n"])
    base, retry = runtime.store.list_experiments(sweep.id)
    assert runtime.store.get_sweep("n").status is SweepStatus.PAUSED
    assert base.record is not None and base.record.ending is Ending.NOT_STARTED
    assert base.status is ExperimentStatus.CANCELLED and base.crash_kind is None
    assert retry.retry_of == base.id and retry.status is ExperimentStatus.QUEUED
    why = base.reason or ""
    assert "/nonexistent/bin/python3" in why, why
    job = runtime.store.list_runs(experiment_id=base.id)[0].slurm_job_id
    assert f"Slurm job {job} on {slurm_cluster.node}" in why
    runtime.close()


GRES_REFUSAL = ("sbatch refused the job: Invalid generic resource (gres) specification; this "
                "cluster may have no GPUs: run with --slurm-gpus 0, or name its gres with "
                "--slurm-gres")


def test_a_job_sbatch_refuses_is_not_started_and_the_command_says_why(slurm_cluster, tmp_path):
    """The test node has no GPUs, so sbatch refuses the `--gres=gpu:1` every job asks for by
    default: `overnight run` says so in one sentence with the fix and exits 2; the baseline is
    recorded not started (not crashed, not interrupted) and queued again, the sweep paused,
    and nothing blames the script. Resumed with --slurm-gpus 0, the night runs."""
    from agent.core.domain import SweepStatus
    from db.location import DbLocation
    from db.reads import Reads
    from overnight.cli_setup import baseline_checks

    make_target(tmp_path / "target", tmp_path / "release")
    db = tmp_path / "o.db"
    work = DbLocation.parse(db.resolve()).default_work_dir()
    argv = [OVERNIGHT, "run", "--target", str(tmp_path / "target"), "--sweep", "s",
            "--experiments", "2", "--executor", "slurm", "--db", str(db)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"error: {GRES_REFUSAL}", proc.stderr
    assert "Traceback" not in proc.stderr
    for blame in ("summary block", "budget honoured", "✗", "crash"):
        assert blame not in proc.stdout + proc.stderr, (blame, proc.stdout, proc.stderr)
    assert "sweep s is paused: the baseline was not started" in proc.stdout
    runtime = Runtime(db)
    try:
        store = runtime.store
        sweep = store.get_sweep("s")
        assert sweep.status is SweepStatus.PAUSED
        base, retry = store.list_experiments(sweep.id)
        assert base.status is ExperimentStatus.CANCELLED and base.reason == GRES_REFUSAL
        assert base.record is not None and base.record.ending is Ending.NOT_STARTED
        assert base.crash_kind is None and base.crash_cause is None
        assert not base.meta.get("warnings")  # no contract warning
        (run,) = store.list_runs(experiment_id=base.id)
        assert run.status is RunStatus.CANCELLED and run.note == GRES_REFUSAL
        assert run.slurm_job_id is None and not our_jobs(work)  # nothing was submitted
        assert retry.is_baseline and retry.retry_of == base.id
        assert retry.status is ExperimentStatus.QUEUED
        assert baseline_checks(Reads(store), sweep) == []  # doctor's checklist: nothing
    finally:
        runtime.close()
    fixed = subprocess.run([*argv, "--resume", "--slurm-gpus", "0"], capture_output=True,
                           text=True, timeout=240, check=False)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    runtime = Runtime(db)
    try:
        exps = runtime.store.list_experiments(runtime.store.get_sweep("s").id)
        assert exps[0].record is not None and exps[0].record.ending is Ending.NOT_STARTED
        assert exps[1].retry_of == exps[0].id and exps[1].status is ExperimentStatus.KEPT
        assert len(exps) == 4 and all(e.status.is_finished() for e in exps), [
            (e.id, e.status, e.reason) for e in exps]
    finally:
        runtime.close()


def test_a_refused_change_pauses_the_sweep_before_the_next_one(slurm_cluster, tmp_path):
    """The baseline is in; the first change's job is refused: it is not started and queued
    again, the sweep pauses, and the changes queued behind it are not run (nor refused)."""
    from agent.core.domain import SweepStatus

    runtime, sweep, engine = night(tmp_path, "local", [])
    engine.run_burst(["n"])  # the baseline, here
    train = (tmp_path / "target" / "train.py").read_text()
    for description, old, new in PROPOSALS[1:]:
        runtime.store.add_experiment(sweep.id, Proposal(description, diff(train, old, new)))
    refusing = SchedulerSettings(executor="slurm", grace_s=0.5, poll_interval_s=0.1)  # a GPU
    runtime.recover(refusing)
    SlotScheduler(runtime.store, refusing, runtime.loop_factory(refusing)).run_burst(["n"])
    store = runtime.store
    assert store.get_sweep("n").status is SweepStatus.PAUSED
    exps = store.list_experiments(sweep.id)
    assert [e.status for e in exps] == [
        ExperimentStatus.KEPT, ExperimentStatus.CANCELLED, ExperimentStatus.QUEUED,
        ExperimentStatus.QUEUED, ExperimentStatus.QUEUED]
    refused = exps[1]
    assert refused.record is not None and refused.record.ending is Ending.NOT_STARTED
    assert refused.reason == GRES_REFUSAL and exps[-1].retry_of == refused.id
    assert not store.list_runs(experiment_id=exps[2].id)  # the next change never ran
    assert not our_jobs(runtime.work_dir)
    assert store.get_sweep("n").baseline_metric is not None
    runtime.close()


def test_a_job_gets_what_a_run_may_get_of_the_environment_and_never_a_secret(monkeypatch):
    """sbatch (so the job, and Slurm's record of it) gets the allow-listed variables, the
    target's pass_env names and Slurm's own; never the service's token or an API key."""
    from agent.executors.slurm import job_environment

    for name, value in (("OVERNIGHT_TOKEN", "t" * 20), ("OPENAI_API_KEY", "sk-x"),
                        ("OVERNIGHT_DB", "/srv/o.db"), ("HF_TOKEN", "hf"), ("MY_DATA", "/d"),
                        ("SLURM_CONF", "/etc/slurm/test.conf"), ("PATH", "/usr/bin")):
        monkeypatch.setenv(name, value)
    env = job_environment(["HF_TOKEN"])
    assert env["PATH"] == "/usr/bin" and env["SLURM_CONF"] == "/etc/slurm/test.conf"
    assert env["HF_TOKEN"] == "hf"  # the target asked for it (pass_env)
    assert not {"OVERNIGHT_TOKEN", "OPENAI_API_KEY", "OVERNIGHT_DB", "MY_DATA"} & set(env)


def test_each_refusal_names_the_setting_that_fixes_it():
    """sbatch's words for a refused job, each with the fix for the setting at fault."""
    from agent.executors.slurm import SlurmSettings, refusal

    gres = "Invalid generic resource (gres) specification"
    assert refusal(gres, SlurmSettings(), 300) == GRES_REFUSAL
    assert "name one they have with --slurm-gres" in refusal(
        gres, SlurmSettings(gres="gpu:a100:1"), 300)
    assert "drop the GPU request from --slurm-option" in refusal(
        gres, SlurmSettings(gpus=0, options=("--gpus=1",)), 300)
    cases = {"Invalid account or account/partition combination specified": "--slurm-account",
             "Invalid partition name specified": "--slurm-partition",
             "Invalid qos specification": "--slurm-qos",
             "Job violates accounting/QOS policy (job submit limit, user's size and/or time "
             "limits)": "lower --slots",
             "Requested time limit is invalid (missing or exceeds some limit)": "--time=8 ",
             "Requested node configuration is not available": "ask for less"}
    for words, fix in cases.items():
        said = refusal(words, SlurmSettings(), 300)
        assert said.startswith(f"sbatch refused the job: {words}; ") and fix in said, said
    assert refusal("Something new", SlurmSettings(), 300) == (
        "sbatch refused the job: Something new")
