"""`overnight demo` on the machine it meets: how busy the machine is and what that will cost,
the budget and the changes the demo tries there, and the one sentence it ends with.

Pure: the stdlib, agent.core and the record. The CLI reads the load average and the cores and
prints what this says. A busy machine gets a compute budget (each run trains the same steps
whatever the load, so the load cannot decide a keep) and the cores the others leave, one at
least (on the shared 2-core machine at load 7-9 a run took 3-5 times as long on two threads as
on one; at load 2-3 one took 1.5 times as long as two: benchmarks/README.md, the demo's rows).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agent.core.budget import ComputeBudget
from agent.core.domain import Experiment, ExperimentStatus, Sweep
from agent.core.record import Ending
from agent.rules.wording import metric_text, runs_word

BUSY_PER_CORE = 0.25  # a load average per core from which other jobs move a run's speed
QUIET_BUDGET_S = 6.0  # a quiet machine: training seconds a run
BUSY_STEPS = 20  # a busy machine: optimizer steps a run (benchmarks/README.md, the demo's rows)
# What a run of the gpt target costs on one idle core: start-up and evaluation, and a step
# (fitted to the demos of benchmarks/README.md at load 1.6-7: within about 25 %).
RUN_OVERHEAD_S, STEP_S = 5.0, 0.35
RUNS_PER_CHANGE = 2  # about, for a change of the knobs search (a clear loser stops at one run)
# The changes tried, in order (the knobs search fills in past them): two learning rates and a
# warm-up the target does clearly worse with (each decided on one run), then the change that
# usually wins at that budget, last (so the others are compared with the baseline's runs): on a
# time budget a smaller model trains more steps in the same seconds; on 20 steps, Muon
# (benchmarks/README.md, the demo's rows). A change neither clearly better nor worse would run
# up to max_runs times: the demo has no room for it.
_FIRST = (("LR", "1.5e-3"), ("LR", "6e-3"), ("WARMUP_FRAC", "0.2"))
TIME_CHANGES = (*_FIRST, ("DEPTH", "2"))
STEP_CHANGES = (*_FIRST, ("USE_MUON", "True"))


@dataclass(frozen=True)
class Machine:
    """The machine the demo meets: its 1-minute load average and its cores."""

    load: float
    cores: int

    @property
    def busy(self) -> bool:
        return self.load >= BUSY_PER_CORE * self.cores

    @property
    def threads(self) -> int:
        """Threads a run: the cores other jobs leave free (at least one), all on a quiet one."""
        return max(1, math.floor(self.cores - self.load)) if self.busy else self.cores

    def line(self) -> str:
        """One line: how busy it is."""
        want = max(1, round(self.load))
        state = (f"busy (about {want} process{'es' if want != 1 else ''} want"
                 f"{'' if want != 1 else 's'} its {self.cores} cores at once)"
                 if self.busy else "quiet")
        return f"This machine: load average {self.load:.2f} on {self.cores} cores: {state}."


@dataclass(frozen=True)
class DemoPlan:
    machine: Machine
    budget: float | ComputeBudget  # training seconds, or steps
    threads: int
    changes: tuple[tuple[str, str], ...]  # (knob, new literal), tried first, in order
    runs: int  # about how many runs the demo makes

    @property
    def run_s(self) -> float:
        """About how long a run takes here: its work on one idle core, slowed by the others'."""
        slowdown = max(1.0, (self.machine.load + self.threads) / self.machine.cores)
        if isinstance(self.budget, ComputeBudget):
            return (RUN_OVERHEAD_S + self.budget.amount * STEP_S) * slowdown / self.threads
        return self.budget + RUN_OVERHEAD_S * slowdown / self.threads

    @property
    def timeout_s(self) -> float:
        """The hard kill of a run: generous, as the load may rise."""
        return max(5 * self.run_s, 180.0)

    def budget_line(self) -> str:
        """One plain line: which budget, and why."""
        if isinstance(self.budget, ComputeBudget):
            threads = "one thread" if self.threads == 1 else f"{self.threads} threads"
            return (f"Each run trains {self.budget} on {threads}: a fixed amount of training, "
                    "so the load changes how long a run takes, not what it learns.")
        return (f"Each run trains for {self.budget:g} s on {self.threads} thread(s): a change "
                "that trains faster gets more steps in that time, and can win by it.")

    def cost_line(self) -> str:
        minutes = self.runs * (self.run_s + 1.0) / 60
        return (f"Expect about {self.runs} runs of ~{self.run_s:.0f} s each: "
                f"~{max(1, round(minutes))} minute(s).")


def plan_demo(machine: Machine, budget: float | ComputeBudget | None = None,
              experiments: int = 4, baseline_runs: int = 5) -> DemoPlan:
    """The demo for `machine`: a time budget on a quiet one, BUSY_STEPS on a busy one, unless
    `budget` is given; the changes that suit that budget."""
    if budget is None:
        budget = ComputeBudget(BUSY_STEPS, "steps") if machine.busy else QUIET_BUDGET_S
    compute = isinstance(budget, ComputeBudget)
    threads = machine.threads
    chosen = STEP_CHANGES if compute else TIME_CHANGES
    changes = chosen if experiments >= len(chosen) else (*chosen[:experiments - 1], chosen[-1])
    # the chosen changes: one run each, the winner (last) two; the search's: about two each
    runs = baseline_runs + len(changes) + 1 + RUNS_PER_CHANGE * (experiments - len(changes))
    return DemoPlan(machine, budget, threads, changes, runs)


# --- the one sentence it ends with --------------------------------------------------------------
FAILED = frozenset({Ending.CRASHED, Ending.TIMEOUT, Ending.RUN_FAILED, Ending.TAMPERED,
                    Ending.REFUSED, Ending.GAVE_UP})


def closing_sentence(sweep: Sweep, experiments: Sequence[Experiment], target: str) -> str:
    """What the demo found, in one plain sentence read from the records: the change kept, or
    why nothing was and what to do."""
    changes = [e for e in experiments if not e.is_baseline and e.record is not None]
    lower = sweep.direction.value == "minimize"
    better = "lower" if lower else "higher"
    kept = [e for e in changes if e.status is ExperimentStatus.KEPT]
    if kept:
        return "; ".join(_kept(e, sweep.metric, better) for e in kept) + "."
    if not changes:
        return (f"Nothing was tried after the baseline: see `overnight results --sweep "
                f"{sweep.name}`.")
    endings = {e.record.ending for e in changes if e.record is not None}
    if Ending.NOT_JUDGED in endings:
        return ("Nothing was kept: the machine's speed changed under the runs, so a change "
                "could not be told from the load; run `overnight demo --budget \"20 steps\"`, "
                "which trains a fixed amount whatever the load.")
    if endings <= FAILED:
        return (f"Nothing was kept: every change failed to run; `overnight results --sweep "
                f"{sweep.name}` shows why.")
    closest = max(changes, key=lambda e: _gain(e, lower))
    gain = _gain(closest, lower)
    rec = closest.record
    if gain > 0 and rec is not None and rec.sigma is not None:
        return (f"Nothing was kept: the closest, {closest.description}, came out better by "
                f"{metric_text(gain)} on the mean of its {runs_word(rec.n)}, but repeated runs "
                f"of the same code scatter by about {rec.sigma:.3g}, too close to call; "
                f"{_less_scatter(sweep.config.budget)}.")
    return (f"Nothing was kept: no change of the {len(changes)} tried did better than the "
            f"baseline ({better} {sweep.metric} is better); a longer night tries more: "
            f"`overnight run --target {target} --experiments 20`.")


def _less_scatter(budget: ComputeBudget | None) -> str:
    """What makes a close call clearer: a compute budget on a time one (the machine's speed is
    part of a time budget's scatter), else a longer one."""
    if budget is None:
        return (f"`overnight demo --budget \"{BUSY_STEPS} steps\"` trains the same amount in "
                "every run, so the machine's speed no longer adds to the scatter")
    longer = ComputeBudget(3 * budget.amount, budget.unit)
    return f"a longer budget tells them apart: `overnight demo --budget \"{longer}\"`"


def _kept(e: Experiment, metric: str, better: str) -> str:
    rec = e.record
    assert rec is not None
    own, base = rec.change, rec.incumbent
    if base is None or base.mean is None or own.mean is None:
        return f"Kept {e.description}"
    return (f"Kept {e.description}: {metric} {metric_text(own.mean)}, the mean of its "
            f"{runs_word(own.n)}, against {metric_text(base.mean)}, the mean of the "
            f"{runs_word(base.n)} it was compared with ({better} is better)")


def _gain(e: Experiment, lower: bool) -> float:
    gain = e.record.gain(lower) if e.record is not None else None
    return gain if gain is not None else -math.inf
