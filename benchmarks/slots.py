"""Experiments per hour with 1, 4 and 8 slots on one engine, and the share of a slot's wall time
spent inside training budgets.

A sleep trainer (no cores needed: start-up 0.5 s, then a 2 s "training" budget) runs through
the real engine in burst mode — git worktrees, subprocesses, SQLite, keep/discard — with fake
devices pinned per slot. Each slot gets the same number of experiments on independent knobs. By
default every change makes the metric worse, so each is one run and a discard, and the
incumbent is never re-run (`incumbent_every = 0`): the figure is the engine's capacity. With
--keeps every change improves it, and the rate also carries the keep rule's work (confirmation
runs, in-flight runs re-run on each new head); --incumbent-every 8 adds the default rule's
re-runs of the best (one slot's extra run lands on the burst's end, which the short burst
magnifies).

Two rates per row. "steady" is what a night runs at: runs started between the moment every
slot is busy (the N-th start) and the last start, per second — the one-off ramp (slots claim
their first experiment in turn) and tail (slots go idle one by one as the queue runs dry) are
left out, and printed as the seconds they cost the burst. "burst" is experiments over the whole
timed wall, ramp and tail included. Target: N slots run >= 0.95 x N times the single-slot
steady rate.

    .venv/bin/python benchmarks/slots.py [--slots 1 4 8] [--per-slot 10] [--budget 2]
"""

from __future__ import annotations

import argparse
import difflib
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

from agent.core.domain import Experiment, ExperimentStatus, Proposal, RunRole, Sweep
from agent.engine.scheduler import SchedulerSettings, SlotScheduler
from agent.git.repo import init_repo
from agent.ops.sweeps import create_sweep
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
incumbent_every = {incumbent_every}
'''


def make_target(root: Path, n_knobs: int, budget: float, keeps: bool = False,
                incumbent_every: int = 0) -> tuple[Path, str]:
    knobs = "\n".join(f"K{i} = 0\n{FILLER}" for i in range(n_knobs))
    train = TRAIN.format(startup=STARTUP_S, knobs=knobs, sign="-" if keeps else "+")
    root.mkdir(parents=True)
    (root / "train.py").write_text(train)
    (root / "overnight.toml").write_text(TOML.format(
        budget=budget, timeout=budget * 10 + 30, incumbent_every=incumbent_every))
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


def steady_rate(starts: list[datetime], slots: int) -> float | None:
    """Runs per second while every slot is busy: the runs started from the N-th start (the last
    slot's first) up to the last start (after which slots only go idle), over that span. None
    when the burst is too short to have such a span."""
    ordered = sorted(starts)
    if len(ordered) <= slots:
        return None
    span = (ordered[-1] - ordered[slots - 1]).total_seconds()
    return (len(ordered) - slots) / span if span > 0 else None


def measure(tmp: Path, slots: int, per_slot: int, budget: float, keeps: bool = False,
            incumbent_every: int = 0) -> dict[str, float]:
    n = slots * per_slot
    target, train = make_target(tmp / f"target-{slots}", n, budget, keeps, incumbent_every)
    runtime = Runtime(tmp / f"o-{slots}.db")
    settings = SchedulerSettings(slots=slots, devices=tuple(str(i) for i in range(slots)))
    sweep, base, wall = timed_burst(runtime, target, train, n, settings)
    exps = [e for e in runtime.store.list_experiments(sweep.id) if not e.is_baseline]
    ran = [e for e in exps if e.run_started_at and e.run_ended_at]
    assert all(e.status is not ExperimentStatus.QUEUED for e in exps)
    runs = [r for r in runtime.store.list_runs(sweep_id=sweep.id) if r.started_at and r.ended_at]
    timed = [r for r in runs if r.experiment_id != base.id or r.role is not RunRole.BASELINE]
    mine = [r for r in timed if r.experiment_id != base.id]
    spans = [(r.ended_at - r.started_at).total_seconds() for r in mine]  # type: ignore[operator]
    runtime.close()
    steady = steady_rate([r.started_at for r in timed], slots)  # type: ignore[misc]
    per_exp = len(timed) / len(ran)  # runs per experiment (confirmations, incumbent re-runs)
    return {"slots": slots, "experiments": len(ran), "runs": len(timed), "wall_s": wall,
            "per_hour": len(ran) / wall * 3600,
            "steady_per_hour": steady * 3600 / per_exp if steady else float("nan"),
            "ramp_tail_s": wall - len(timed) / steady if steady else float("nan"),
            "per_run_wall_s": slots / steady if steady else float("nan"),
            "run_median_s": statistics.median(spans)}


def report(rows: list[dict[str, float]], args: argparse.Namespace) -> None:
    single = next((r for r in rows if r["slots"] == 1), None)
    print(f"sleep trainer: {STARTUP_S:g} s start-up + {args.budget:g} s budget, "
          f"{args.per_slot} experiments per slot, incumbent re-run every "
          f"{args.incumbent_every or 'never'}{', every change a keep' if args.keeps else ''}")
    print("slots  experiments  runs  wall s  burst exp/h  x single  steady exp/h  x single  "
          "target  ramp+tail s  slot s per run")
    for r in rows:
        burst = r["per_hour"] / single["per_hour"] if single else float("nan")
        steady = r["steady_per_hour"] / single["steady_per_hour"] if single else float("nan")
        print(f"{r['slots']:>5.0f}  {r['experiments']:>11.0f}  {r['runs']:>4.0f}  "
              f"{r['wall_s']:>6.1f}  {r['per_hour']:>11.0f}  {burst:>8.2f}  "
              f"{r['steady_per_hour']:>12.0f}  {steady:>8.2f}  {0.95 * r['slots']:>6.2f}  "
              f"{r['ramp_tail_s']:>11.1f}  {r['per_run_wall_s']:>14.2f}")
    if single:
        service = single["per_run_wall_s"] - args.budget - STARTUP_S  # what the service adds
        share = 300 / (300 + STARTUP_S + service)
        print(f"service overhead per run (1 slot, steady, excluding the trainer's {STARTUP_S:g} s "
              f"start-up): {service:.2f} s; share of a slot's wall time inside a 300 s budget "
              f"(same overheads): {share:.1%} (target >= 97.5 %)")
    print("command: .venv/bin/python benchmarks/slots.py " + " ".join(
        ["--slots", *map(str, args.slots), "--per-slot", str(args.per_slot),
         "--budget", f"{args.budget:g}", *(["--keeps"] if args.keeps else []),
         *(["--incumbent-every", str(args.incumbent_every)] if args.incumbent_every else [])]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--per-slot", type=int, default=10)
    ap.add_argument("--budget", type=float, default=2.0)
    ap.add_argument("--keeps", action="store_true",
                    help="every change improves the metric: each keep takes confirmation runs "
                    "and sends in-flight runs back to re-run on the new head (the keep rule's "
                    "cost, not the slots'); default: every change is discarded after one run")
    ap.add_argument("--incumbent-every", type=int, default=0,
                    help="re-run the best every N decided proposals (the target's default rule "
                    "says 8); default 0: never, so every run is a proposal's")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(Path(tmp), n, args.per_slot, args.budget, args.keeps,
                        args.incumbent_every) for n in args.slots]
    report(rows, args)


if __name__ == "__main__":
    main()
