"""The line a person reads per finished experiment (overnight.console): which reasons it shows."""

from __future__ import annotations

import pytest

from agent.core.domain import Experiment, ExperimentStatus
from overnight.console import describe


def _exp(status: ExperimentStatus, reason: str | None) -> Experiment:
    return Experiment(1, 1, status, "D_MODEL 128 -> 256", "", "knobs", reason=reason)


@pytest.mark.parametrize("status, reason", [
    (ExperimentStatus.KEPT, "better: mean 3.41 of 2 runs vs best 3.52, σ̂ 0.02, z 3.1"),
    (ExperimentStatus.DISCARDED, "not better: mean 3.6 of 1 run vs best 3.52, z -1.2"),
    (ExperimentStatus.DISCARDED, "not clearly better after 4 runs: mean 3.50 of 4 runs"),
    (ExperimentStatus.DISCARDED, None),
])
def test_a_plain_keep_or_not_better_shows_the_description_alone(
        status: ExperimentStatus, reason: str | None) -> None:
    assert describe(_exp(status, reason)) == "D_MODEL 128 -> 256"


@pytest.mark.parametrize("status, reason", [
    (ExperimentStatus.DISCARDED, "run 2 (seed 43) failed: timed out after 12 s"),
    (ExperimentStatus.DISCARDED, "stopped at 30 % of the budget: loss 4.31 vs the incumbent's "
                                 "4.01 ± 0.030 at the same point"),
    (ExperimentStatus.DISCARDED, "discarded: the machine's speed kept changing around its runs"),
    (ExperimentStatus.CRASHED, "NameError: name 'x' is not defined"),
])
def test_any_other_outcome_names_its_reason(status: ExperimentStatus, reason: str) -> None:
    # e.g. a discard whose second run timed out: its delta alone looks like a gain
    assert describe(_exp(status, reason)) == f"D_MODEL 128 -> 256  [{reason}]"
