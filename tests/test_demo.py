"""`overnight demo` on the machine it meets (agent.ops.demo): the plan a load average makes, and
the one sentence the demo ends with, read from the records (never from reasons)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from agent.core.budget import ComputeBudget
from agent.core.config import parse_config
from agent.core.domain import Experiment, ExperimentStatus, Sweep, SweepStatus
from agent.core.record import RECORD_KEY, Ending, Measured, VerdictRecord
from agent.ops.demo import (
    BUSY_STEPS,
    QUIET_BUDGET_S,
    STEP_CHANGES,
    TIME_CHANGES,
    Machine,
    closing_sentence,
    plan_demo,
)

JARGON = ("σ", "incumbent", "sigma", "condition", "p-value", "FDR", "df")


def test_a_busy_machine_gets_steps_on_the_cores_it_leaves_free():
    busy = plan_demo(Machine(load=4.6, cores=2))
    assert busy.budget == ComputeBudget(BUSY_STEPS, "steps") and busy.threads == 1
    assert busy.changes == STEP_CHANGES and busy.runs == 5 + 4 + 1  # the winner runs twice
    assert plan_demo(Machine(4.6, 2), experiments=6).runs == 10 + 2 * 2  # the search's: ~2
    assert "busy" in busy.machine.line() and "4.60 on 2 cores" in busy.machine.line()
    assert "one thread" in busy.budget_line() and "not what it learns" in busy.budget_line()
    assert busy.timeout_s >= 180 and "minute" in busy.cost_line()
    assert plan_demo(Machine(1.0, 8)).threads == 8  # quiet: every core, a time budget
    assert plan_demo(Machine(3.0, 8)).threads == 5  # the cores the other jobs leave
    quiet = plan_demo(Machine(load=0.2, cores=2), experiments=2)
    assert quiet.budget == QUIET_BUDGET_S and quiet.threads == 2
    assert "quiet" in quiet.machine.line()
    assert quiet.changes == (TIME_CHANGES[0], TIME_CHANGES[-1])  # fewer: the winner stays
    assert "6 s" in quiet.budget_line()
    # a --budget given wins over the load: steps on a quiet machine, seconds on a busy one
    assert plan_demo(Machine(0.2, 2), ComputeBudget(50, "steps")).changes == STEP_CHANGES
    given = plan_demo(Machine(4.0, 2), 3.0)
    assert given.budget == 3.0 and given.threads == 1 and given.changes == TIME_CHANGES
    assert busy.run_s > plan_demo(Machine(0.0, 2), ComputeBudget(BUSY_STEPS, "steps")).run_s


CONFIG = parse_config({"command": "python train.py", "editable": ["train.py"],
                       "metric": "val_bpb", "budget": "20 steps"})
SWEEP = Sweep(1, "demo-1", "/t", "overnight/demo-1", SweepStatus.DONE, "knobs", CONFIG, 4, 3.53,
              3.42, None, None, datetime.now(UTC))
BASE = Measured((1, 2, 3, 4, 5), (3.53, 3.54, 3.52, 3.535, 3.525))


def exp(i, status, description, ending, change=(), difference=None, sigma=0.012):
    record = VerdictRecord(ending, Measured(tuple(range(10 * i, 10 * i + len(change))),
                                            tuple(change)),
                           incumbent=BASE, difference=difference, sigma=sigma, df=5)
    return Experiment(i, 1, status, description, "", "knobs",
                      meta={RECORD_KEY: record.to_json()})


BASELINE = Experiment(1, 1, ExperimentStatus.KEPT, "baseline", "", "baseline", is_baseline=True,
                      meta={RECORD_KEY: VerdictRecord(Ending.BASELINE, BASE).to_json()})
WORSE = exp(2, ExperimentStatus.DISCARDED, "LR 3e-3 -> 6e-3", Ending.NOT_BETTER, (4.2,), 0.67)
CLOSE = exp(3, ExperimentStatus.DISCARDED, "WARMDOWN_FRAC 0.3 -> 0.1", Ending.NOT_BETTER,
            (3.52, 3.525), -0.008)


@pytest.mark.parametrize("night, says", [
    ([WORSE, exp(4, ExperimentStatus.KEPT, "USE_MUON False -> True", Ending.KEPT,
                  (3.42, 3.41), -0.115)],
     "Kept USE_MUON False -> True: val_bpb 3.415000, the mean of its 2 runs, against 3.530000, "
     "the mean of the 5 runs it was compared with (lower is better)."),
    ([WORSE, CLOSE], "Nothing was kept: the closest, WARMDOWN_FRAC 0.3 -> 0.1, came out better "
     "by 0.008000 on the mean of its 2 runs, but repeated runs of the same code scatter by "
     "about 0.012, too close to call; a longer budget tells them apart: `overnight demo "
     "--budget \"60 steps\"`."),
    ([WORSE], "Nothing was kept: no change of the 1 tried did better than the baseline"),
    ([WORSE, exp(4, ExperimentStatus.DISCARDED, "DEPTH 4 -> 2", Ending.NOT_JUDGED, (3.3,),
                 -0.2)],
     "Nothing was kept: the machine's speed changed under the runs"),
    ([exp(2, ExperimentStatus.CRASHED, "D_MODEL 128 -> 4096", Ending.CRASHED)],
     "Nothing was kept: every change failed to run"),
])
def test_the_demo_ends_with_one_plain_sentence_from_the_records(night, says):
    said = closing_sentence(SWEEP, [BASELINE, *night], "/tmp/demo-target")
    assert said.startswith(says) and said.endswith(".") and said.count(". ") == 0
    assert not any(word in said for word in JARGON), said


def test_a_close_call_on_a_time_budget_points_to_a_compute_budget():
    timed = replace(SWEEP, config=CONFIG.with_budget(6.0))
    said = closing_sentence(timed, [BASELINE, CLOSE], "/tmp/demo-target")
    assert said.endswith(f'too close to call; `overnight demo --budget "{BUSY_STEPS} steps"` '
                         "trains the same amount in every run, so the machine's speed no longer "
                         "adds to the scatter.")
