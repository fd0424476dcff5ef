"""The keep rule's adapters to the store's run records: which runs it decides on, a Run as the
Sample placement reads, a commit's value from a sweep's runs (the one definition of the best),
and the sweep's measured speed tolerance. Pure: the domain and the rules only.
"""
from __future__ import annotations

from collections.abc import Sequence

from agent.core.bounds import finite_number
from agent.core.domain import Run, RunStatus
from agent.rules.noise import speed_noise, speed_tolerance
from agent.rules.placement import Sample, best_of

USABLE = (RunStatus.OK, RunStatus.SUSPECT)  # runs with a metric the rule decides on


def sample(r: Run, keys: Sequence[str] = ()) -> Sample:
    """The run as the rule reads it; `keys`: the summary-block keys its bounds read (from
    r.summary, where the store loaded it)."""
    assert r.metric is not None
    values = tuple((k, v) for k in keys if (v := finite_number((r.summary or {}).get(k)))
                   is not None)
    return Sample(r.metric, r.throughput, r.id, r.seed, r.device, r.pair_run_id,
                  r.throughput_source, values)


def recorded_best(runs: Sequence[Run], commit: str, tolerance: float | None = None,
                  time_budget: bool = True) -> tuple[float | None, list[Run], list[bool]]:
    """The best as every screen shows it: best_of the commit's good runs, at the sweep's
    measured speed tolerance (`tolerance`: runs_tolerance of the sweep's runs, when known);
    with those runs and whether each is off the usual condition."""
    good = [r for r in runs if r.status in USABLE and r.metric is not None]
    change_runs = [r for r in good if r.commit == commit]
    tol = runs_tolerance(good, time_budget) if tolerance is None else tolerance
    value, other_speed = best_of([sample(r) for r in change_runs], tol)
    return value, change_runs, other_speed


def runs_tolerance(runs: Sequence[Run], time_budget: bool = True) -> float:
    """The speed tolerance measured on a sweep's good runs (in start order); on a compute
    budget (`time_budget` False) any speed agrees."""
    good = [r for r in runs if r.status in USABLE and r.metric is not None]
    return speed_tolerance(speed_noise([(r.commit, r.device, r.throughput) for r in good]),
                           time_budget)
