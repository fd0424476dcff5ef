"""The Slurm executor on a one-node loopback cluster: its overhead per run against the local
executor, and kill -9s of the service during a Slurm sweep (nothing doubled, nothing lost).

Needs root and Debian's slurm-wlm and munge (`./dev.sh test` installs them): the cluster is
tests/slurm_cluster.py's (munged, slurmctld, slurmd in a temp dir, this machine its one node).

Overhead: the sleep trainer of benchmarks/slots.py (0.5 s start-up, then the budget) runs a
sweep of `--experiments` changes, each a discard after one run, through the real engine in
burst mode, first with the local executor, then with `executor = "slurm"` on the same target
(one slot each). A run's wall is its record's (started → ended: for Slurm, sbatch, the queue,
the job's start, the result read back). Slurm's overhead per run = the median Slurm run's wall
minus the median local run's. Target: <= 2 s on this node. `--slurm-defaults` runs the cluster
with Slurm's own scheduler settings (a batch job's scheduling deferred by up to 3 s,
batch_sched_delay) instead of the tests' batch_sched_delay=0.

Kills: `overnight run --executor slurm --slots 2` on a queue of `--experiments` changes is
killed with SIGKILL `--kills` times, each a random moment (up to one run) after a job is seen
running, and started again with --resume; then it runs to the end. Checked: every job Slurm
ever had for this work dir is recorded on a run (none submitted behind the records' back), every
run the kills cut off had its job adopted by its experiment's retry (the same job id on both
runs; "doubled" counts those whose job was not although the retry ran the same commit tree;
"rerun_on_a_new_head" those whose retry ran the change on a head another keep had moved, which
only happens with --keeps), every change has one verdict that is not `interrupted` ("lost"
counts those without), and no job, job folder or worktree is left.

    .venv/bin/python benchmarks/slurm_overhead.py [--experiments 20] [--kills 10] [--seed 0]
        [--keeps] [--slurm-defaults] [--only overhead|kills]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import slurm_cluster  # noqa: E402
from slots import STARTUP_S, knob_diff, make_target, timed_burst  # noqa: E402

from agent.core.domain import ExperimentStatus, Proposal, RunStatus, utcnow  # noqa: E402
from agent.engine.scheduler import SchedulerSettings  # noqa: E402
from agent.executors.slurm import work_key  # noqa: E402
from agent.executors.slurm_cli import jobs  # noqa: E402
from agent.ops.sweeps import create_sweep  # noqa: E402
from db.location import DbLocation  # noqa: E402
from overnight.runtime import Runtime  # noqa: E402

OVERNIGHT = str(Path(sys.executable).parent / "overnight")


def run_walls(tmp: Path, executor: str, n: int, budget: float) -> dict[str, object]:
    """A burst of n one-run changes through `executor`: the runs' walls (s) and the rate."""
    root = tmp / executor
    target, train = make_target(root / "target", n, budget)
    runtime = Runtime(root / "o.db")
    settings = SchedulerSettings(slots=1, executor=executor, slurm_gpus=0)
    runtime.recover(settings)
    sweep, base, wall = timed_burst(runtime, target, train, n, settings)
    runs = [r for r in runtime.store.list_runs(sweep_id=sweep.id)
            if r.experiment_id != base.id and r.ended_at is not None]
    walls = [(r.ended_at - r.started_at).total_seconds() for r in runs]  # type: ignore[operator]
    ok = sum(r.status is RunStatus.OK for r in runs)
    runtime.close()
    return {"executor": executor, "runs": len(runs), "ok": ok, "walls": walls,
            "per_hour": n / wall * 3600}


def overhead(tmp: Path, n: int, budget: float) -> dict[str, object]:
    local, slurm = (run_walls(tmp, e, n, budget) for e in ("local", "slurm"))
    lw, sw = sorted(local["walls"]), sorted(slurm["walls"])  # type: ignore[type-var]
    extra = statistics.median(sw) - statistics.median(lw)
    return {"experiments": n, "budget_s": budget, "startup_s": STARTUP_S,
            "local_median_s": round(statistics.median(lw), 3),
            "slurm_median_s": round(statistics.median(sw), 3),
            "slurm_overhead_median_s": round(extra, 3),
            "slurm_overhead_p90_s": round(sw[int(0.9 * (len(sw) - 1))] - statistics.median(lw),
                                          3),
            "local_per_hour": round(local["per_hour"]),  # type: ignore[call-overload]
            "slurm_per_hour": round(slurm["per_hour"]),  # type: ignore[call-overload]
            "runs_ok": [local["ok"], slurm["ok"]], "target_met": extra <= 2.0}


def kills(tmp: Path, n: int, count: int, budget: float, seed: int,
          keeps: bool) -> dict[str, object]:
    rng = random.Random(seed)
    target, train = make_target(tmp / "kills" / "target", n, budget, keeps)
    db = tmp / "kills" / "o.db"
    runtime = Runtime(db)
    sweep = create_sweep(runtime.store, runtime.repo_at(target), target, name="k",
                         proposer="queue")
    for i in range(n):
        runtime.store.add_experiment(sweep.id, Proposal(f"K{i} on", knob_diff(train, i)))
    runtime.close()
    work = DbLocation.parse(db.resolve()).default_work_dir()
    prefix = f"overnight-{work_key(work)}-"
    argv = [OVERNIGHT, "run", "--target", str(target), "--sweep", "k", "--resume", "--slots",
            "2", "--executor", "slurm", "--slurm-gpus", "0", "--db", str(db)]
    done = 0
    reader = Runtime(db)  # reads only (WAL): which runs this life has in flight
    while done < count:
        since = utcnow()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and not in_flight(
                reader, prefix, since):
            time.sleep(0.05)
        if proc.poll() is not None:
            break  # the sweep ended before this kill
        time.sleep(rng.uniform(0, STARTUP_S + budget))
        proc.kill()
        proc.wait()
        done += 1
        print(f"kill -9 #{done}", flush=True)
    reader.close()
    final = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    return {"kills": done, "final_exit": final.returncode, **check(db, work, prefix, target)}


def in_flight(reader: Runtime, prefix: str, since: datetime) -> bool:
    """A run this life started (or adopted) whose Slurm job is running."""
    running = {r.slurm_job_id for r in reader.store.list_runs()
               if r.status is RunStatus.RUNNING and r.slurm_job_id and r.started_at
               and r.started_at >= since}
    return any(s.state == "RUNNING" and j in running for j, s in jobs(prefix).items())


def check(db: Path, work: Path, prefix: str, target: Path) -> dict[str, object]:
    runtime = Runtime(db)
    try:
        exps = runtime.store.list_experiments()
        runs = runtime.store.list_runs()
    finally:
        runtime.close()
    listed = jobs(prefix)
    recorded = {r.slurm_job_id for r in runs if r.slurm_job_id}
    cut = [r for r in runs if r.status is RunStatus.INTERRUPTED]
    adopted = [r for r in cut if any(o.slurm_job_id == r.slurm_job_id and o.id != r.id
                                     for o in runs)]
    changes = [e for e in exps if e.retry_of is None and not e.is_baseline]
    retries = {e.retry_of: e for e in exps if e.retry_of is not None}

    def tree(commit: str) -> str:
        return subprocess.run(["git", "-C", str(target), "rev-parse", f"{commit}^{{tree}}"],
                              capture_output=True, text=True, check=True).stdout.strip()

    def later_trees(exp_id: int) -> set[str]:
        """The trees the interrupted experiment's retries ran."""
        found = set()
        while exp_id in retries:
            exp_id = retries[exp_id].id
            found |= {tree(r.commit) for r in runs if r.experiment_id == exp_id}
        return found

    missed = [r for r in cut if r not in adopted]
    moved = [r for r in missed if tree(r.commit) not in later_trees(r.experiment_id)]

    def verdict(exp_id: int) -> ExperimentStatus:
        exp = next(e for e in exps if e.id == exp_id)
        while exp.status is ExperimentStatus.INTERRUPTED and exp.id in retries:
            exp = retries[exp.id]
        return exp.status

    lost = [e.id for e in changes if verdict(e.id) in (ExperimentStatus.INTERRUPTED,
                                                       ExperimentStatus.QUEUED,
                                                       ExperimentStatus.RUNNING)]
    left = {"jobs alive": [j for j, s in listed.items() if s.alive],
            "job folders": [p.name for p in (work / "slurm").iterdir()]
            if (work / "slurm").is_dir() else [],
            "worktrees": [str(p) for p in (work / "worktrees").rglob("exp-*")]}
    return {"changes": len(changes),  # each proposal, and each re-queued on a new head
            "runs": len(runs), "jobs_submitted": len(listed),
            "jobs_not_on_a_run": sorted(set(listed) - recorded),
            "runs_cut_off": len(cut), "adopted": len(adopted),
            # its retry ran the change on a head another keep had moved meanwhile: other code
            "rerun_on_a_new_head": len(moved),
            "doubled": len(missed) - len(moved), "lost": lost,
            "given_up": sum(e.status is ExperimentStatus.CRASHED for e in exps),
            "verdicts": dict(Counter(verdict(e.id).value for e in changes)),
            "left": {k: v for k, v in left.items() if v}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiments", type=int, default=20)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--slurm-defaults", action="store_true",
                    help="Slurm's own SchedulerParameters (batch_sched_delay 3 s)")
    ap.add_argument("--only", choices=("overhead", "kills"))
    ap.add_argument("--keeps", action="store_true",
                    help="the killed sweep's changes all improve the metric (keeps move the "
                    "branch while the other slot's job runs); default: all discarded")
    args = ap.parse_args()
    why = slurm_cluster.why_unavailable()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    cluster = slurm_cluster.start_cluster(None if args.slurm_defaults else
                                          slurm_cluster.FAST_SCHEDULING)
    os.environ["SLURM_CONF"] = str(cluster.conf)
    result: dict[str, object] = {"load_before": os.getloadavg()[0]}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if args.only != "kills":
                result["overhead"] = overhead(Path(tmp), args.experiments, args.budget)
                print(json.dumps(result["overhead"]), flush=True)
            if args.only != "overhead" and args.kills:
                result["kills"] = kills(Path(tmp), args.experiments, args.kills, args.budget,
                                        args.seed, args.keeps)
    finally:
        cluster.stop()
    result["load_after"] = os.getloadavg()[0]
    print(json.dumps(result, indent=2))
    k = result.get("kills")
    bad = isinstance(k, dict) and (k["doubled"] or k["lost"] or k["left"]
                                   or k["jobs_not_on_a_run"])
    over = result.get("overhead")
    return 1 if bad or (isinstance(over, dict) and not over["target_met"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
