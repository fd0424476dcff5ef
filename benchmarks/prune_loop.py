"""A short night of the curve fake target with the early stop off and on: training seconds spent,
keeps, runs stopped early, and stopped changes that the night without it kept.

The fake trainer is tests/fixtures/curve_target (loss = a + b·exp(−t/τ) + seed noise, progress
lines with an elapsed time for its budget), with extra independent knobs SHIFT_i that move the
whole curve. The night's changes, the same for both modes and in the same order:

- harmful: SHIFT_i = +0.05 … +0.4 (clearly behind from the start: the stop's target);
- null: UNUSED = k (curves track the incumbent's);
- small gains: SHIFT_i = −0.02, −0.04 (hyper-parameter changes: judged, must not be stopped);
- a crossing change: WARMDOWN_FRAC = 0.5 (behind early, better at the end; data/schedule).

Both nights run through the real engine (git worktrees, subprocesses, SQLite, the keep rule) on
`--slots` slots. "training s" is the sum of every run's training seconds (a pruned run's up to
its stop), the GPU-seconds of a real night; "wall s" the night's wall clock.

    .venv/bin/python benchmarks/prune_loop.py [--budget 2] [--slots 1] [--harmful 6] [--null 4]

`--target gpt` runs the reference target (experiments/gpt, on this machine's device: CPU here)
instead, with its baseline runs (3) and two changes: LR = 3e-5 (harmful: a hundredth of the
learning rate) and ROPE_BASE = 10001.0 (null); `--modes auto` runs only the night with the
early stop (a harmful change's run then says what it saved against its budget).

    .venv/bin/python benchmarks/prune_loop.py --target gpt --budget 60 --modes auto
    .venv/bin/python benchmarks/prune_loop.py --target gpt --budget-steps 48 --modes auto

`--prune-table` appends a [prune] table to the target's overnight.toml (docs/target.md), e.g.
`--prune-table 'exempt = []'`: every kind of change may be stopped early.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agent.core.domain import ExperimentStatus, Proposal, RunStatus
from agent.engine.scheduler import SchedulerSettings, SlotScheduler
from agent.git.repo import init_repo
from agent.ops.sweeps import create_sweep
from overnight.runtime import Runtime

ROOT = Path(__file__).resolve().parent.parent
CURVES = ROOT / "tests" / "fixtures" / "curve_target"
GPT = ROOT / "experiments" / "gpt"
GPT_PLAN = [("LR", "3e-5", "harmful"), ("ROPE_BASE", "10001.0", "null")]
FILLER = "#\n" * 4  # hunks on different knobs never share context
HARMFUL = (0.4, 0.2, 0.1, 0.3, 0.05, 0.15, 0.25, 0.08)
GAINS = (-0.02, -0.04)


@dataclass(frozen=True)
class Change:
    name: str
    value: str
    kind: str  # harmful | null | gain | crossing


@dataclass(frozen=True)
class Night:
    mode: str
    wall_s: float
    training_s: float
    runs: int
    pruned: int
    kept: frozenset[str]
    stopped: frozenset[str]
    statuses: dict[str, str]
    by_kind: dict[str, float]  # training seconds of each kind of change's runs
    reasons: dict[str, str]  # a stopped change's reason


def changes(harmful: int, null: int) -> list[Change]:
    out = [Change(f"SHIFT_{i}", f"{HARMFUL[i % len(HARMFUL)]}", "harmful")
           for i in range(harmful)]
    out += [Change("UNUSED", str(k + 1), "null") for k in range(null)]
    out += [Change(f"SHIFT_{harmful + i}", f"{g}", "gain") for i, g in enumerate(GAINS)]
    out.append(Change("WARMDOWN_FRAC", "0.5", "crossing"))
    order = [out[i] for i in range(0, len(out), 2)] + [out[i] for i in range(1, len(out), 2)]
    return order  # interleaved, so kinds alternate through the night


def make_target(dest: Path, n_shifts: int, budget: float, prune: str, table: str = "") -> Path:
    shutil.copytree(CURVES, dest, ignore=shutil.ignore_patterns("__pycache__"))
    train = (dest / "train.py").read_text()
    knobs = "".join(f"SHIFT_{i} = 0.0  # knobs: shift\n{FILLER}" for i in range(n_shifts))
    train = train.replace("SEED_NOISE = ", knobs + "SEED_NOISE = ", 1)
    (dest / "train.py").write_text(train)
    toml = (dest / "overnight.toml").read_text()
    toml = toml.replace('prune    = "auto"', f'prune    = "{prune}"')
    toml = toml.replace("budget_s = 1.2", f"budget_s = {budget:g}")
    (dest / "overnight.toml").write_text(toml + (f"\n[prune]\n{table}\n" if table else ""))
    init_repo(dest)
    return dest


def make_gpt(dest: Path, budget: float, prune: str, table: str = "", steps: int = 0) -> Path:
    shutil.copytree(GPT, dest, ignore=shutil.ignore_patterns("__pycache__"))
    toml = (dest / "overnight.toml").read_text()
    toml = toml.replace("budget_s  = 300", f'budget    = "{steps} steps"' if steps
                        else f"budget_s  = {budget:g}")
    toml = toml.replace("timeout_s = 900", f"timeout_s = {budget * 4 + 120:g}")
    (dest / "overnight.toml").write_text(
        toml + f'prune = "{prune}"\nincumbent_every = 0\n'
        + (f"\n[prune]\n{table}\n" if table else ""))
    init_repo(dest)
    return dest


def knob_diff(target: Path, name: str, value: str) -> str:
    old = (target / "train.py").read_text().splitlines(True)
    new = [f"{name} = {value}" + line[line.index("  #"):] if line.startswith(f"{name} = ")
           else line for line in old]
    return "".join(difflib.unified_diff(old, new, "a/train.py", "b/train.py"))


def run_night(root: Path, mode: str, plan: list[Change], budget: float, slots: int,
              gpt: bool = False, table: str = "", steps: int = 0) -> Night:
    n_shifts = sum(c.name.startswith("SHIFT_") for c in plan)
    target = (make_gpt(root / f"gpt-{mode}", budget, mode, table, steps) if gpt
              else make_target(root / f"target-{mode}", n_shifts, budget, mode, table))
    rt = Runtime(root / f"{mode}.db")
    sweep = create_sweep(rt.store, rt.repo_at(target), target, name=mode, proposer="queue")
    for c in plan:
        rt.store.add_experiment(sweep.id, Proposal(f"{c.name} = {c.value} ({c.kind})",
                                                   knob_diff(target, c.name, c.value)))
    settings = SchedulerSettings(slots=slots, grace_s=1.0, poll_interval_s=0.1)
    started = time.monotonic()
    SlotScheduler(rt.store, settings, rt.loop_factory(settings)).run_burst([mode])
    wall = time.monotonic() - started
    runs = rt.store.list_runs(sweep_id=sweep.id)
    exps = rt.store.list_experiments(sweep.id)
    label = {e.id: e.description for e in exps}
    # a change re-queued on a moved head is a new row of the same description: the last counts
    last = {e.description: e.status.value for e in sorted(exps, key=lambda e: e.id)
            if not e.is_baseline}
    pruned_exps = {r.experiment_id for r in runs if r.status is RunStatus.PRUNED}
    kind_of = {e.id: e.description.rsplit("(", 1)[-1].rstrip(")") if not e.is_baseline
               else "baseline" for e in exps}
    by_kind: dict[str, float] = {}
    for r in runs:  # an incumbent re-run is recorded under the best's row: its own kind
        kind = "incumbent" if r.role.value == "incumbent" else kind_of[r.experiment_id]
        by_kind[kind] = by_kind.get(kind, 0.0) + (r.training_s or 0.0)
    return Night(
        mode=mode, wall_s=wall, training_s=sum(r.training_s or 0.0 for r in runs),
        runs=len(runs), pruned=sum(r.status is RunStatus.PRUNED for r in runs),
        kept=frozenset(e.description for e in exps
                       if e.status is ExperimentStatus.KEPT and not e.is_baseline),
        stopped=frozenset(label[i] for i in pruned_exps),
        statuses=last, by_kind=by_kind,
        reasons={label[r.experiment_id]: f"{r.note} (trained {r.training_s or 0:.1f} s)"
                 for r in runs if r.status is RunStatus.PRUNED})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=2.0, help="training seconds per run")
    ap.add_argument("--slots", type=int, default=1)
    ap.add_argument("--harmful", type=int, default=6)
    ap.add_argument("--null", type=int, default=4)
    ap.add_argument("--target", choices=("curves", "gpt"), default="curves")
    ap.add_argument("--modes", nargs="+", choices=("off", "auto"), default=["off", "auto"])
    ap.add_argument("--prune-table", default="",
                    help='a [prune] table\'s body for the target, e.g. "exempt = []"')
    ap.add_argument("--budget-steps", type=int, default=0,
                    help="--target gpt: a compute budget of this many steps instead of --budget "
                         "seconds (a shared machine's load then moves no curve)")
    ap.add_argument("--checks", action="store_true",
                    help="print every early-stop check (stopped or not, and why)")
    args = ap.parse_args()
    if args.checks:
        logging.basicConfig(format="  %(message)s")
        logging.getLogger("agent.engine.early_stop").setLevel(logging.INFO)
    gpt = args.target == "gpt"
    plan = [Change(*c) for c in GPT_PLAN] if gpt else changes(args.harmful, args.null)
    with tempfile.TemporaryDirectory(prefix="prune-loop-") as tmp:
        nights = [run_night(Path(tmp), mode, plan, args.budget, args.slots, gpt,
                            args.prune_table.replace("\\n", "\n"), args.budget_steps)
                  for mode in args.modes]
    print(f"{len(plan)} changes ({', '.join(f'{c.name} = {c.value} ({c.kind})' for c in plan)})"
          if gpt else f"{len(plan)} changes ({args.harmful} harmful, {args.null} null, "
          f"{len(GAINS)} small gains, 1 crossing)", f"budget {args.budget:g} s, "
          f"{args.slots} slot(s)")
    print(f"{'prune':6} {'runs':>5} {'pruned':>6} {'training s':>10} {'wall s':>7}  kept")
    for n in nights:
        print(f"{n.mode:6} {n.runs:5d} {n.pruned:6d} {n.training_s:10.1f} {n.wall_s:7.1f}  "
              f"{', '.join(sorted(n.kept)) or '-'}")
        for d, why in sorted(n.reasons.items()):
            print(f"       {d}: {why}")
    if len(nights) < 2:
        return
    off, auto = nights
    kinds = sorted(set(off.by_kind) | set(auto.by_kind))
    print("training s by kind (off -> auto): " + "; ".join(
        f"{k} {off.by_kind.get(k, 0.0):.1f} -> {auto.by_kind.get(k, 0.0):.1f}" for k in kinds))
    saved = 1 - auto.training_s / off.training_s if off.training_s else 0.0
    winners = sorted(auto.stopped & off.kept)
    print(f"training seconds saved: {saved:.1%}; keeps the same: {auto.kept == off.kept}")
    print(f"stopped early: {', '.join(sorted(auto.stopped)) or '-'}")
    print(f"stopped eventual winners (kept with prune off): {', '.join(winners) or 'none'}")
    differ = {d: (off.statuses.get(d), s) for d, s in auto.statuses.items()
              if off.statuses.get(d) != s}
    if differ:
        print("verdicts that differ (off -> auto): " + "; ".join(
            f"{d}: {a} -> {b}" for d, (a, b) in sorted(differ.items())))


if __name__ == "__main__":
    main()
