"""Experiments per hour with 1, 4 and 8 slots on one engine, and the share of a slot's wall time
spent inside training budgets.

A sleep trainer (no cores needed: start-up 0.5 s, then a 2 s "training" budget) runs through
the real engine in burst mode — git worktrees, subprocesses, SQLite, keep/discard — with fake
devices pinned per slot. Each slot gets the same number of experiments on independent knobs. By
default every change makes the metric worse, so each is one run and a discard: the figure is
the engine's capacity. With --keeps every change improves it, and the rate also carries the
keep rule's work (confirmation runs, in-flight runs re-run on each new head). Target: N slots
run >= 0.95 x N times the single-slot rate.

    .venv/bin/python benchmarks/slots.py [--slots 1 4 8] [--per-slot 6] [--budget 2]
"""

from __future__ import annotations

import argparse
import difflib
import statistics
import tempfile
import time
from pathlib import Path

from agent.domain import Experiment, ExperimentStatus, Proposal, Sweep
from agent.gitrepo import init_repo
from agent.scheduler import SchedulerSettings, SlotScheduler
from agent.sweeps import create_sweep
from overnight.runtime import Runtime

STARTUP_S = 0.5
FILLER = "#\n" * 7  # hunks on different knobs never share context
TRAIN = '''import os, sys, time
time.sleep({startup})  # interpreter + imports + data loading, before the clock starts
{knobs}
budget = float(os.environ["OVERNIGHT_BUDGET_S"])
start = time.time()
while time.time() - start < budget:
    time.sleep(0.25)
    print(f"step 1 | loss 1.0 | elapsed {{time.time() - start:.2f}}s", flush=True)
x = sum(v for k, v in dict(globals()).items() if k.startswith("K"))
print("---")
print(f"val_bpb: {{1.0 {sign} 0.001 * x:.6f}}")
print(f"training_seconds: {{time.time() - start:.2f}}")
'''
TOML = '''[target]
command = "python train.py"
editable = ["train.py"]
metric = "val_bpb"
budget_s = {budget}
timeout_s = {timeout}
'''


def make_target(root: Path, n_knobs: int, budget: float,
                keeps: bool = False) -> tuple[Path, str]:
    knobs = "\n".join(f"K{i} = 0\n{FILLER}" for i in range(n_knobs))
    train = TRAIN.format(startup=STARTUP_S, knobs=knobs, sign="-" if keeps else "+")
    root.mkdir(parents=True)
    (root / "train.py").write_text(train)
    (root / "overnight.toml").write_text(TOML.format(budget=budget, timeout=budget * 10 + 30))
    init_repo(root)
    return root, train


def knob_diff(train: str, i: int) -> str:
    old = train.splitlines(True)
    new = [line.replace(f"K{i} = 0\n", f"K{i} = 1\n") for line in old]
    return "".join(difflib.unified_diff(old, new, "a/train.py", "b/train.py"))


def timed_burst(runtime: Runtime, target: Path, train: str, n: int,
                settings: SchedulerSettings) -> tuple[Sweep, Experiment, float]:
    """Queue n knob changes, run the baseline alone (nothing is compared before it), then time
    the engine's burst over the rest: (sweep, baseline, wall seconds)."""
    sweep = create_sweep(runtime.store, runtime.repo_at(target), target, name="bench",
                         proposer="queue")
    for i in range(n):
        runtime.store.add_experiment(sweep.id, Proposal(f"K{i} on", knob_diff(train, i)))
    engine = SlotScheduler(runtime.store, settings, runtime.loop_factory(settings))
    base = runtime.store.claim_next(sweep.id)
    assert base is not None and base.is_baseline
    engine._execute(0, sweep, base, engine._loop(sweep, 0))  # noqa: SLF001 - bench only
    t0 = time.perf_counter()
    engine.run_burst(["bench"])
    return sweep, base, time.perf_counter() - t0


def measure(tmp: Path, slots: int, per_slot: int, budget: float,
            keeps: bool = False) -> dict[str, float]:
    n = slots * per_slot
    target, train = make_target(tmp / f"target-{slots}", n, budget, keeps)
    runtime = Runtime(tmp / f"o-{slots}.db")
    settings = SchedulerSettings(slots=slots, devices=tuple(str(i) for i in range(slots)))
    sweep, base, wall = timed_burst(runtime, target, train, n, settings)
    exps = [e for e in runtime.store.list_experiments(sweep.id) if not e.is_baseline]
    ran = [e for e in exps if e.run_started_at and e.run_ended_at]
    assert all(e.status is not ExperimentStatus.QUEUED for e in exps)
    runs = [r for r in runtime.store.list_runs(sweep_id=sweep.id) if r.experiment_id != base.id]
    spans = [(r.ended_at - r.started_at).total_seconds() for r in runs  # type: ignore[operator]
             if r.started_at and r.ended_at]
    runtime.close()
    per_run_wall = wall * slots / len(runs)  # a slot's wall time per training run
    return {"slots": slots, "experiments": len(ran), "runs": len(runs), "wall_s": wall,
            "per_hour": len(ran) / wall * 3600, "runs_per_hour": len(runs) / wall * 3600,
            "per_run_wall_s": per_run_wall, "run_median_s": statistics.median(spans),
            "overhead_s": per_run_wall - budget}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--per-slot", type=int, default=6)
    ap.add_argument("--budget", type=float, default=2.0)
    ap.add_argument("--keeps", action="store_true",
                    help="every change improves the metric: each keep takes confirmation runs "
                    "and sends in-flight runs back to re-run on the new head (the keep rule's "
                    "cost, not the slots'); default: every change is discarded after one run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(Path(tmp), n, args.per_slot, args.budget, args.keeps)
                for n in args.slots]
    single = next((r for r in rows if r["slots"] == 1), None)
    print(f"sleep trainer: {STARTUP_S:g} s start-up + {args.budget:g} s budget, "
          f"{args.per_slot} experiments per slot")
    print("slots  experiments  runs  wall s  exp/hour  runs/hour  x single  target  "
          "per-run overhead s")
    for r in rows:
        ratio = r["per_hour"] / single["per_hour"] if single else float("nan")
        target = 0.95 * r["slots"]
        print(f"{r['slots']:>5}  {r['experiments']:>11}  {r['runs']:>4}  {r['wall_s']:>6.1f}  "
              f"{r['per_hour']:>8.0f}  {r['runs_per_hour']:>9.0f}  {ratio:>8.2f}  "
              f"{target:>6.2f}  {r['overhead_s']:>8.2f}")
    if single:
        service = single["overhead_s"] - STARTUP_S  # what the service adds per run
        share = 300 / (300 + STARTUP_S + service)
        print(f"service overhead per run (1 slot, excluding the trainer's {STARTUP_S:g} s "
              f"start-up): {service:.2f} s; share of a slot's wall time inside a 300 s budget "
              f"(same overheads): {share:.1%} (target >= 97.5 %)")
    print("command: .venv/bin/python benchmarks/slots.py " + " ".join(
        ["--slots", *map(str, args.slots), "--per-slot", str(args.per_slot),
         "--budget", f"{args.budget:g}", *(["--keeps"] if args.keeps else [])]))


if __name__ == "__main__":
    main()
