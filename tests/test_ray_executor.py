"""The Ray executor on a real two-node local cluster (ray.cluster_utils.Cluster, logical GPUs).

Runs go through the real engine (SlotScheduler in burst mode), real git worktrees and bundles,
real SQLite and real subprocesses on the Ray workers. Covered: keep/discard/tamper results equal
to the local executor's on the same proposals, a timeout and a cancel that leave no process of
the run behind, and a node removed mid-run: interrupted, re-queued once, the retry finishes.
Every address is 127.0.0.1.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import commit_all

from agent.core.domain import ExperimentStatus, Proposal, RunStatus, Sweep
from agent.engine.scheduler import SchedulerSettings, SlotScheduler
from agent.git.repo import init_repo
from agent.ops.sweeps import create_sweep
from overnight.runtime import Runtime
from runner.reaper import pids_with_env
from runner.tree import RUN_ID_ENV

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.slow

TRAIN = '''"""Fake trainer for the Ray tests: the real output contract, MODE picks a behaviour."""
import os
import time

MODE = "normal"  # normal | forever | hold (until RELEASE exists) | hold-first | tamper
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
while MODE == "hold-first" and os.environ["OVERNIGHT_EXPERIMENT_ID"] == "1":
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


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head without GPUs and two worker nodes with two logical GPUs each, on 127.0.0.1."""
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 0, "node_ip_address": "127.0.0.1",
        "include_dashboard": False})
    for _ in range(2):
        c.add_node(num_cpus=2, num_gpus=2, node_ip_address="127.0.0.1")
    c.wait_for_nodes()
    ray.init(address=c.address, namespace="overnight-tests", log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def make_target(path: Path, release: Path, timeout: float = 30) -> tuple[Path, str]:
    path.mkdir(parents=True)
    train = TRAIN.format(release=str(release))
    (path / "train.py").write_text(train)
    (path / "prepare.py").write_text('"""The protected harness."""\n')
    (path / "overnight.toml").write_text(TOML.format(timeout=timeout))
    (path / ".gitignore").write_text("data/\n")
    (path / "data").mkdir()
    (path / "data" / "tokens.txt").write_text("hello\n")
    init_repo(path)
    return path, train


def diff(train: str, old: str, new: str) -> str:
    after = train.replace(old, new)
    assert after != train
    return "".join(difflib.unified_diff(train.splitlines(True), after.splitlines(True),
                                        "a/train.py", "b/train.py"))


def settings(executor: str, slots: int = 1, **kw: object) -> SchedulerSettings:
    return SchedulerSettings(slots=slots, executor=executor, grace_s=0.5, poll_interval_s=0.1,
                             ray_cpus=0, **kw)  # type: ignore[arg-type]


def night(tmp: Path, executor: str, proposals: list[tuple[str, str, str]],
          timeout: float = 30, slots: int = 1) -> tuple[Runtime, Sweep, SlotScheduler]:
    target, train = make_target(tmp / "target", tmp / "release", timeout)
    runtime = Runtime(tmp / "o.db")
    sweep = create_sweep(runtime.store, runtime.repo_at(target), target, name="n",
                         proposer="queue")
    for description, old, new in proposals:
        runtime.store.add_experiment(sweep.id, Proposal(description, diff(train, old, new)))
    chosen = settings(executor, slots)
    engine = SlotScheduler(runtime.store, chosen, runtime.loop_factory(chosen))
    return runtime, sweep, engine


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = 120) -> object:
    """Poll a state; the deadline only bounds a hang."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def leftovers(runtime: Runtime, exp_id: int) -> set[int]:
    """Processes anywhere on this machine (every node is local) carrying the run's id."""
    from agent.engine.attempt import run_id_prefix

    return pids_with_env(RUN_ID_ENV, run_id_prefix(runtime.work_dir, exp_id), prefix=True)


def outcomes(runtime: Runtime, sweep: Sweep) -> list[tuple[str, str, float | None, str]]:
    return [(e.description, e.status.value, e.metric, e.crash_kind.value if e.crash_kind else "")
            for e in runtime.store.list_experiments(sweep.id)]


PROPOSALS = [("tamper", 'MODE = "normal"', 'MODE = "tamper"'),
             ("K1 helps", "K1 = 0\n", "K1 = 1\n"), ("K2 hurts", "K2 = 0\n", "K2 = -1\n"),
             ("K3 helps", "K3 = 0\n", "K3 = 2\n")]


def test_results_through_ray_equal_the_local_executors(cluster, tmp_path):
    results, tampered = {}, {}
    for executor in ("local", "ray"):
        runtime, sweep, engine = night(tmp_path / executor, executor, PROPOSALS)
        engine.run_burst(["n"])
        results[executor] = outcomes(runtime, sweep)
        exps = runtime.store.list_experiments(sweep.id)
        tampered[executor] = exps[1].reason or ""
        log = Path(exps[2].log_path or "").read_text()
        assert "data hello" in log and "val_bpb: 0.999000" in log  # the log came back
        if executor == "ray":  # a remote process group is never recorded as a local one
            assert all(r.pgid is None for r in runtime.store.list_runs(sweep_id=sweep.id))
        runtime.close()
    assert results["ray"] == results["local"]
    statuses = [s for _, s, _, _ in results["ray"]]
    assert statuses == ["kept", "crashed", "kept", "discarded", "kept"], results["ray"]
    assert "prepare.py" in tampered["ray"] and tampered["ray"] == tampered["local"]


def test_a_run_past_its_deadline_is_killed_on_the_worker(cluster, tmp_path):
    runtime, sweep, engine = night(tmp_path, "ray", [("forever", 'MODE = "normal"',
                                                      'MODE = "forever"')], timeout=3)
    engine.run_burst(["n"])
    exps = runtime.store.list_experiments(sweep.id)
    assert [e.status for e in exps] == [ExperimentStatus.KEPT, ExperimentStatus.TIMEOUT]
    assert "data hello" in Path(exps[1].log_path or "").read_text()
    assert not leftovers(runtime, exps[1].id)
    runtime.close()


def test_a_cancel_reaches_the_workers_process_tree(cluster, tmp_path):
    runtime, sweep, engine = night(tmp_path, "ray", [("forever", 'MODE = "normal"',
                                                      'MODE = "forever"')])
    burst = threading.Thread(target=engine.run_burst, args=(["n"],), daemon=True)
    burst.start()
    store = runtime.store
    exp = wait_until(lambda: next((e for e in store.list_experiments(sweep.id)
                                   if not e.is_baseline and e.status.value == "running"), None),
                     "the long run to start")
    wait_until(lambda: leftovers(runtime, exp.id), "its process on a worker")  # type: ignore
    assert engine.cancel(exp.id)  # type: ignore[attr-defined]
    burst.join(120)
    assert not burst.is_alive()
    done = store.get_experiment(exp.id)  # type: ignore[attr-defined]
    assert done.status is ExperimentStatus.CANCELLED
    assert not leftovers(runtime, done.id)
    runtime.close()


def node_running(c: Cluster, pids: set[int]) -> object:
    """The worker node whose raylet has one of `pids` below it."""
    def parent(pid: int) -> int:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rpartition(")")[2].split()[1])

    ancestors: set[int] = set()
    for pid in pids:
        try:
            while pid > 1:
                pid = parent(pid)
                ancestors.add(pid)
        except OSError:
            continue
    for node in c.worker_nodes:
        raylets = node.all_processes.get("raylet", [])
        if any(info.process.pid in ancestors for info in raylets):
            return node
    raise AssertionError("no worker node runs the run")


def test_a_node_lost_mid_run_interrupts_and_requeues_once(cluster, tmp_path):
    runtime, sweep, engine = night(tmp_path, "ray", [("hold", 'MODE = "normal"',
                                                      'MODE = "hold"')])
    burst = threading.Thread(target=engine.run_burst, args=(["n"],), daemon=True)
    burst.start()
    store = runtime.store
    exp = wait_until(lambda: next((e for e in store.list_experiments(sweep.id)
                                   if not e.is_baseline and e.status.value == "running"), None),
                     "the held run to start")
    pids = wait_until(lambda: leftovers(runtime, exp.id), "its process on a worker")  # type: ignore
    node = node_running(cluster, pids)  # type: ignore[arg-type]
    try:
        cluster.remove_node(node, allow_graceful=False)
        retry = wait_until(lambda: store.retry_of(exp.id), "the re-queue")  # type: ignore
        (tmp_path / "release").write_text("go")  # the retry (on the other node) may finish
        burst.join(180)
        assert not burst.is_alive()
    finally:
        for pid in leftovers(runtime, exp.id):  # type: ignore[attr-defined]
            os.kill(pid, 9)  # the dead node's orphans (its processes were local)
        cluster.add_node(num_cpus=2, num_gpus=2, node_ip_address="127.0.0.1")
    exps = store.list_experiments(sweep.id)
    lost = store.get_experiment(exp.id)  # type: ignore[attr-defined]
    assert lost.status is ExperimentStatus.INTERRUPTED
    assert "worker running it was lost" in (lost.reason or "")
    assert [e.retry_of for e in exps].count(lost.id) == 1
    again = store.get_experiment(retry.id)  # type: ignore[attr-defined]
    assert again.status is ExperimentStatus.DISCARDED and again.metric == 1.0, again.reason
    runs = {r.experiment_id: r.status for r in store.list_runs(sweep_id=sweep.id)}
    assert runs[lost.id] is RunStatus.INTERRUPTED and runs[again.id] is RunStatus.OK
    runtime.close()


def test_overnight_run_executor_ray_through_the_console_script(cluster, tmp_path):
    target, _ = make_target(tmp_path / "target", tmp_path / "release")
    db = tmp_path / "o.db"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "overnight"), "run", "--target", str(target),
         "--experiments", "2", "--executor", "ray", "--ray-address", cluster.address,
         "--ray-cpus", "0", "--db", str(db)],
        capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runtime = Runtime(db)
    try:
        exps = runtime.store.list_experiments()
        # baseline + 2 proposals; the cluster's slots run the two side by side, so one whose
        # branch moved while it ran goes on as a continuation (on a busy machine, often)
        seen = [(e.id, e.status.value, e.description, e.reason, e.parent_id) for e in exps]
        first = [e for e in exps if e.parent_id is None]
        assert len(first) == 3 and exps[0].status is ExperimentStatus.KEPT, seen
        moved = {e.id for e in exps if "re-queued on the new head" in (e.reason or "")}
        assert all(e.parent_id in moved for e in exps if e.parent_id is not None), seen
        assert all(e.status.is_finished() and e.status is not ExperimentStatus.INTERRUPTED
                   for e in exps)
        assert "data hello" in Path(exps[0].log_path or "").read_text()
    finally:
        runtime.close()


def test_overnight_mcp_run_executes_an_agents_proposal_on_ray(cluster, tmp_path):
    """`overnight mcp --run --executor ray`: a coding agent's proposal (the official MCP client
    over stdio) runs as a Ray task; a remote run records no local process group."""
    from mcp.client.stdio import get_default_environment
    from test_mcp import night_target, propose_width_over_stdio

    db, _ = night_target(tmp_path)
    # An MCP client hands its server a minimal environment: the Ray setting that keeps this
    # cluster on 127.0.0.1 goes in the server's `env`, as in a client's config file.
    env = {**get_default_environment(), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    done, base = propose_width_over_stdio(
        ["mcp", "--db", str(db), "--run", "--executor", "ray", "--ray-address",
         cluster.address, "--ray-cpus", "0"], timeout_s=180, env=env)
    assert base["status"] == "kept"
    assert done["status"] == "kept" and done["delta"] == pytest.approx(-0.1)
    runtime = Runtime(db)
    try:
        runs = runtime.store.list_runs()
        assert len(runs) >= 2 and all(r.pgid is None for r in runs), runs
    finally:
        runtime.close()


def test_a_restart_after_the_coordinator_died_requeues_its_run_once(cluster, tmp_path):
    """kill -9 of `overnight run` mid-run: Ray ends the tasks it owned, run and all; the next
    start records the experiment interrupted and re-queues it once, and the retry finishes."""
    from agent.engine.attempt import run_id_prefix
    from db.location import DbLocation

    target, train = make_target(tmp_path / "target", tmp_path / "release")
    (target / "train.py").write_text(train.replace('MODE = "normal"', 'MODE = "hold-first"'))
    commit_all(target, "the first baseline holds")
    db = tmp_path / "o.db"
    prefix = run_id_prefix(DbLocation.parse(db.resolve()).default_work_dir(), 1)
    argv = [str(Path(sys.executable).parent / "overnight"), "run", "--target", str(target),
            "--sweep", "s", "--experiments", "0", "--executor", "ray", "--ray-address",
            cluster.address, "--ray-cpus", "0", "--db", str(db)]
    first = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: pids_with_env(RUN_ID_ENV, prefix, prefix=True), "the baseline's run")
    finally:
        first.kill()
        first.wait()
    try:
        proc = subprocess.run([*argv, "--resume"], capture_output=True, text=True, timeout=240,
                              check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        wait_until(lambda: not pids_with_env(RUN_ID_ENV, prefix, prefix=True),
                   "nothing of the dead coordinator's run left")
    finally:
        for pid in pids_with_env(RUN_ID_ENV, prefix, prefix=True):
            os.kill(pid, 9)
    runtime = Runtime(db)
    try:
        exps = runtime.store.list_experiments()
        assert [(e.status, e.retry_of) for e in exps] == [
            (ExperimentStatus.INTERRUPTED, None), (ExperimentStatus.KEPT, exps[0].id)]
    finally:
        runtime.close()


def test_local_only_options_are_refused_with_the_ray_executor(tmp_path):
    target, _ = make_target(tmp_path / "target", tmp_path / "release")
    overnight = str(Path(sys.executable).parent / "overnight")
    bad = [(["--executor", "kubernetes"], "--executor: expected 'local', 'ray' or 'slurm'"),
           (["--executor", "ray", "--devices", "0,1"], "--devices is for the local executor"),
           (["--ray-address", "127.0.0.1:1"], "need --executor ray"),
           (["--executor", "ray", "--ray-resource", "A100"], "--ray-resource: expected NAME")]
    for args, message in bad:
        proc = subprocess.run([overnight, "run", "--target", str(target), "--db",
                               str(tmp_path / "o.db"), *args], capture_output=True, text=True,
                              timeout=60, check=False)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
    assert not (tmp_path / "o.db").exists()  # refused before anything was created


def test_a_force_cancel_sweeps_the_runs_processes_off_its_node(cluster, tmp_path):
    """A worker that does not end the run when asked is killed from here (ray.cancel with
    force), and what it started is found on its node by OVERNIGHT_RUN_ID and killed too."""
    from agent.executors.ray import RayExecutor, RaySettings, make_bundle
    from agent.executors.ray_follow import Follow
    from agent.executors.remote_run import RemoteRequest
    from runner.result import Outcome

    target, train = make_target(tmp_path / "target", tmp_path / "release")
    (target / "train.py").write_text(train.replace('MODE = "normal"', 'MODE = "forever"'))
    commit_all(target, "forever")
    head = subprocess.run(["git", "-C", str(target), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    run_id = f"force-test-{os.getpid()}:1:0"
    request = RemoteRequest(commit=head, argv=[sys.executable, "train.py"], workdir=".",
                            timeout_s=600, env={RUN_ID_ENV: run_id}, grace_s=0.5,
                            asset_root=str(target), assets=("data",))
    executor = RayExecutor(RaySettings(num_cpus=0))
    follow = Follow(executor.link(), request, tmp_path / "run.log", None, None)
    ended: list[object] = []
    thread = threading.Thread(target=lambda: ended.append(follow.run(make_bundle(target))),
                              daemon=True)
    thread.start()
    try:
        log = tmp_path / "run.log"
        wait_until(lambda: log.exists() and "data hello" in log.read_text(), "its first line")
        assert pids_with_env(RUN_ID_ENV, run_id)
        result = follow._force(Outcome.STOPPED, "asked by the test")  # noqa: SLF001
        assert result.outcome is Outcome.STOPPED and "data hello" in result.log_tail
        assert result.error == "asked by the test"
        wait_until(lambda: not pids_with_env(RUN_ID_ENV, run_id), "the run's processes to go",
                   timeout_s=60)
        thread.join(60)
        assert not thread.is_alive()
    finally:
        for pid in pids_with_env(RUN_ID_ENV, run_id):
            os.kill(pid, 9)
        executor.close()


def test_a_run_no_node_can_hold_is_not_started_and_pauses_the_sweep(cluster, tmp_path):
    """Each run asks for 4 GPUs and the largest node has 2: no task is submitted; the baseline
    is recorded not started with the sentence that says what is short and the fix, queued
    again, and the sweep paused (not left waiting for a node that never comes)."""
    from agent.core.domain import SweepStatus
    from agent.core.record import Ending

    target, _ = make_target(tmp_path / "target", tmp_path / "release")
    runtime = Runtime(tmp_path / "o.db")
    sweep = create_sweep(runtime.store, runtime.repo_at(target), target, name="n",
                         proposer="queue")
    chosen = settings("ray", ray_gpus=4)
    SlotScheduler(runtime.store, chosen, runtime.loop_factory(chosen)).run_burst(["n"])
    store = runtime.store
    assert store.get_sweep("n").status is SweepStatus.PAUSED
    base, retry = store.list_experiments(sweep.id)
    assert base.record is not None and base.record.ending is Ending.NOT_STARTED
    assert base.status is ExperimentStatus.CANCELLED and base.crash_kind is None
    assert base.reason == ("no node of the Ray cluster has 4 GPU(s) for a run (the most a node "
                           "has is 2): run with --ray-gpus 0, or join a node with GPUs")
    assert retry.retry_of == base.id and retry.status is ExperimentStatus.QUEUED
    assert not leftovers(runtime, base.id)
    runtime.close()


def test_what_no_node_can_hold_is_named_with_its_fix():
    from agent.executors.ray import RaySettings, unfit

    nodes = [{"CPU": 1.0}, {"CPU": 2.0, "GPU": 2.0}, {"CPU": 8.0, "A100": 1.0}]
    assert unfit(nodes, RaySettings()) is None
    assert unfit(nodes, RaySettings(num_gpus=0, num_cpus=8)) is None
    assert unfit(nodes, RaySettings(num_cpus=4)) == (
        "no single node of the Ray cluster has all a run asks for (GPU=1, CPU=4): ask for less "
        "(--ray-gpus, --ray-cpus, --ray-resource), or join a node that has it all")
    assert "has the resource H100=1 for a run (the most a node has is 0): leave out " \
        "--ray-resource" in (unfit(nodes, RaySettings(resources={"H100": 1.0})) or "")
    assert unfit([], RaySettings(num_gpus=0)) == (
        "no node of the Ray cluster has 1 CPU(s) for a run (the most a node has is 0): lower "
        "--ray-cpus, or join a larger node")
