"""What `overnight demo` says around its night: the machine it meets and the plan for it before
the first run; after the last, what the numbers mean and the one sentence it ends with.

The command itself lives in overnight.cli (it drives the night with run_foreground); the plan
and the sentence are agent.ops.demo's.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from rich.markup import escape

from agent.core.budget import ComputeBudget, parse_budget
from agent.core.domain import Proposal, Sweep
from agent.ops.demo import DemoPlan, Machine, closing_sentence, plan_demo
from agent.proposers.knobs import knob_proposal
from db.reads import Reads
from overnight.cli_common import console, fail


def machine_now() -> Machine:
    """This machine: its 1-minute load average and the cores this process may use."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return Machine(os.getloadavg()[0], cores or 1)


def demo_plan(budget: str | None, experiments: int) -> DemoPlan:
    """The plan for this machine (`budget`: --budget, seconds or "20 steps"), printed."""
    try:
        given = None if budget is None else parse_budget(budget)
    except ValueError as exc:
        fail(f"--budget: {exc}")
    plan = plan_demo(machine_now(), given, experiments)
    console.print(plan.machine.line(), soft_wrap=True, markup=False)
    console.print(("(--budget given) " if budget else "") + plan.budget_line(), soft_wrap=True,
                  markup=False)
    console.print(plan.cost_line(), soft_wrap=True, markup=False)
    return plan


def run_env(plan: DemoPlan) -> dict[str, str]:
    """What the runs get beyond the usual: their thread count where it is not every core."""
    return {} if plan.threads == plan.machine.cores else {"OMP_NUM_THREADS": str(plan.threads)}


def proposals(plan: DemoPlan, target: Path) -> list[Proposal]:
    """The plan's changes as proposals against the target's train.py."""
    files = {"train.py": (target / "train.py").read_text(encoding="utf-8")}
    return [knob_proposal(files, (change,)) for change in plan.changes]


def legend(sweep: Sweep, shifts: int) -> str:
    """The one line that says what the demo's numbers mean."""
    load = (f"; {shifts} change(s) met another machine speed and were compared with baseline "
            "runs made at the same speed" if shifts else "")
    trained = ("of CPU training" if isinstance(sweep.config.budget, ComputeBudget)
               else "of CPU training time")
    return (f"What the numbers mean: {sweep.metric} is bits per byte of held-out text (lower is "
            f"better) after {sweep.config.budget_text} {trained}; a change is kept only when "
            "its runs beat the baseline's by more than the spread between runs of the same code "
            f"can explain, which holds false keeps to {sweep.config.fdr:.0%} of all keeps{load}.")


def overheads(reads: Reads, sweep: Sweep) -> list[float]:
    """Seconds from one run's exit to the next run's start."""
    times = [(a, b) for a, b in reads.timestamps(sweep.id) if a and b]
    return [(b[0] - a[1]).total_seconds() for a, b in zip(times, times[1:], strict=False)]


def print_end(reads: Reads, sweep: Sweep, experiments: list, target: Path,  # type: ignore[type-arg]
              shifts: int) -> None:
    gaps = overheads(reads, sweep)
    if gaps:
        console.print(f"\nservice overhead between runs: median {statistics.median(gaps):.3f}s")
    console.print(f"\n{legend(sweep, shifts)}", soft_wrap=True, markup=False)
    said = closing_sentence(sweep, experiments, str(target))
    console.print(f"\n[bold]{escape(said)}[/bold]", soft_wrap=True)
