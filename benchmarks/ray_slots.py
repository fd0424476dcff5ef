"""Experiments per hour through the Ray executor at 1 vs 4 slots, and the per-run overhead Ray adds.

The same sleep trainer as benchmarks/slots.py (0.5 s start-up, then a 2 s "training" budget)
runs through the real engine in burst mode with `executor = "ray"` on a local Ray cluster of two
nodes with two logical GPUs each (4 in all, every address 127.0.0.1): each run is a Ray task
with num_gpus=1 that receives its commit as a git bundle, clones it and runs it with the runner.
The local executor runs the same proposals at each slot count, right before, for the comparison
(targets: Ray >= 0.9 x N, local >= 0.95 x N). Per-run overhead = a
run record's wall time minus the trainer's own start-up + budget. Target: 4 slots run
>= 0.9 x 4 times the single-slot rate, at the steady rate (benchmarks/slots.py: runs started
while every slot is busy; the burst's one-off ramp and tail are printed beside it).

    .venv/bin/python benchmarks/ray_slots.py [--slots 1 4] [--per-slot 6] [--budget 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from slots import STARTUP_S, make_target, steady_rate, timed_burst  # noqa: E402

from agent.core.domain import ExperimentStatus  # noqa: E402
from agent.engine.scheduler import SchedulerSettings  # noqa: E402
from overnight.runtime import Runtime  # noqa: E402

GPUS_PER_NODE = 2
NODES = 2


def start_cluster() -> object:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 0, "node_ip_address": "127.0.0.1",
        "include_dashboard": False})
    for _ in range(NODES):
        cluster.add_node(num_cpus=4, num_gpus=GPUS_PER_NODE, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def measure(tmp: Path, executor: str, slots: int, per_slot: int,
            budget: float) -> dict[str, float | str | list[float]]:
    n = slots * per_slot
    root = tmp / f"{executor}-{slots}"
    target, train = make_target(root / "target", n, budget)
    runtime = Runtime(root / "o.db")
    settings = SchedulerSettings(slots=slots, executor=executor, ray_cpus=1)
    sweep, _, wall = timed_burst(runtime, target, train, n, settings)
    exps = [e for e in runtime.store.list_experiments(sweep.id) if not e.is_baseline]
    assert all(e.status is not ExperimentStatus.QUEUED for e in exps)
    ids = {e.id for e in exps}
    runs = [r for r in runtime.store.list_runs(sweep_id=sweep.id)
            if r.experiment_id in ids and r.ended_at is not None]
    overheads = [(r.ended_at - r.started_at).total_seconds() - STARTUP_S - budget  # type: ignore
                 for r in runs]
    runtime.close()
    steady = steady_rate([r.started_at for r in runs], slots)  # type: ignore[misc]
    per_exp = len(runs) / len(exps)
    return {"executor": executor, "slots": slots, "experiments": len(exps), "wall_s": wall,
            "per_hour": len(exps) / wall * 3600, "runs_per_hour": len(runs) / wall * 3600,
            "steady_per_hour": steady * 3600 / per_exp if steady else float("nan"),
            "ramp_tail_s": wall - len(runs) / steady if steady else float("nan"),
            "overheads": overheads}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--per-slot", type=int, default=10)
    ap.add_argument("--budget", type=float, default=2.0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    cluster = start_cluster()
    started = time.perf_counter() - t0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = [measure(Path(tmp), executor, n, args.per_slot, args.budget)
                    for n in args.slots for executor in ("local", "ray")]
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()  # type: ignore[attr-defined]
    report(rows, args, started)


def report(rows: list[dict], args: argparse.Namespace, started: float) -> None:
    """The table: experiments and runs per hour (a keep takes two runs, and a run measured on a
    head another slot moved is re-queued), and the per-run overhead Ray adds over the local
    executor at the same number of slots (same machine, same moment)."""
    single = {r["executor"]: r for r in rows if r["slots"] == 1}
    print(f"sleep trainer: {STARTUP_S:g} s start-up + {args.budget:g} s budget, "
          f"{args.per_slot} experiments per slot; local Ray cluster: {NODES} nodes x "
          f"{GPUS_PER_NODE} logical GPUs (started in {started:.1f} s, not counted)")
    print("executor  slots  experiments  wall s  burst exp/h  x single  steady exp/h  x single  "
          "target  ramp+tail s  overhead/run median  p90")
    for r in rows:
        one = single.get(r["executor"])
        ratio = r["per_hour"] / one["per_hour"] if one else float("nan")
        steady = r["steady_per_hour"] / one["steady_per_hour"] if one else float("nan")
        target = f"{(0.9 if r['executor'] == 'ray' else 0.95) * r['slots']:>6.2f}"
        print(f"{r['executor']:>8}  {r['slots']:>5}  {r['experiments']:>11}  {r['wall_s']:>6.1f}"
              f"  {r['per_hour']:>11.0f}  {ratio:>8.2f}  {r['steady_per_hour']:>12.0f}  "
              f"{steady:>8.2f}  {target}  {r['ramp_tail_s']:>11.1f}  "
              f"{statistics.median(r['overheads']):>19.2f}  {p90(r['overheads']):>4.2f}")
    local = {r["slots"]: r for r in rows if r["executor"] == "local"}
    for r in rows:
        base = local.get(r["slots"])
        if r["executor"] != "ray" or base is None:
            continue
        print(f"Ray adds per run at {r['slots']} slot(s): median "
              f"{statistics.median(r['overheads']) - statistics.median(base['overheads']):+.2f} s"
              f", p90 {p90(r['overheads']) - p90(base['overheads']):+.2f} s; steady "
              f"experiments/hour {r['steady_per_hour'] / base['steady_per_hour']:.2f} x the local "
              "executor's")
    print("command: .venv/bin/python benchmarks/ray_slots.py " + " ".join(
        ["--slots", *map(str, args.slots), "--per-slot", str(args.per_slot),
         "--budget", f"{args.budget:g}"]))


if __name__ == "__main__":
    main()
