"""Experiments with a verdict record (agent.core.record), as the loop writes them, for tests that
build experiments by hand: the value is the mean of the runs the record names, the difference
is from the incumbent runs it was compared with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from agent.core.domain import Experiment
from agent.core.record import RECORD_KEY, Ending, Measured, VerdictRecord


def runs(values: Sequence[float], first_id: int = 1, commit: str | None = None) -> Measured:
    return Measured(tuple(range(first_id, first_id + len(values))), tuple(values), commit)


def record(ending: Ending, values: Sequence[float] = (), *, compared: Sequence[float] = (),
           best: Sequence[float] = (), difference: float | None = None, se: float | None = None,
           **more: Any) -> VerdictRecord:
    """A record whose change ran `values` and was compared with `compared`; the difference is
    their means' unless given (one machine condition)."""
    change = runs(values, 1)
    incumbent = runs(compared, 100) if compared else None
    if difference is None and change.mean is not None and incumbent is not None:
        assert incumbent.mean is not None
        difference = change.mean - incumbent.mean
    return VerdictRecord(ending, change, incumbent=incumbent,
                         best=runs(best, 200) if best else incumbent, difference=difference,
                         se=se, **more)


def recorded(exp: Experiment, found: VerdictRecord) -> Experiment:
    """`exp` finished with `found` as its record: its metric the mean of its runs, its best
    before the record's best."""
    return replace(exp, meta={**exp.meta, RECORD_KEY: found.to_json()},
                   metric=found.change.mean if found.change.n else exp.metric,
                   best_before=found.best.mean if found.best is not None else exp.best_before)
