"""A sweep page's whole-sweep parts (counts and time, plot, evidence, digest) as running state,
so that the first view after a finish costs the finish, not the sweep.

A SweepFold holds what those parts sum over the sweep's finished experiments and ended runs
(agent.analysis.insights_fold, agent.analysis.evidence.EvidenceFold, plot.PlotFold, the Rollup of
counts and training time) and which rows are still open. `advance` takes the next SweepHistory: the
rows that finished since are folded into a copy (the previous fold is left as it was) in id order;
one that finished while a lower id is still open waits in `pending` (drawn from a copy with it
added, folded in once the rows below it finish). Nothing folded depends on the sweep's best or
baseline (gains are against each run's own best_before; the parts read the best when drawn), so a
keep folds in like any finish. A history read again in full (a flipped verdict, a row gone), an
open row that went away or another direction make a new fold from the whole history (`build`).
Either way the parts equal what the whole-sweep functions compute from the same rows
(tests/test_sweep_fold.py).
"""

from __future__ import annotations

import bisect
import functools
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from agent.analysis.evidence import EvidenceFold, SweepEvidence
from agent.analysis.insights import Insights
from agent.analysis.insights_fold import DigestFold
from agent.core.domain import (
    RAN_STATUSES,
    Experiment,
    ExperimentStatus,
    Run,
    RunStatus,
    Sweep,
    utcnow,
)

from .history import SweepHistory
from .plot_data import PlotFold

S = ExperimentStatus


# --- a sweep's counts and training time, summed or kept as running state ----------------------
RUNS = RAN_STATUSES


@dataclass
class Rollup:
    """Counts and time used by one sweep."""

    counts: Counter[str] = field(default_factory=Counter)
    train_s: float = 0.0

    @property
    def gpu_hours(self) -> float:
        return self.train_s / 3600

    def add(
        self, status: str, started: datetime | None, ended: datetime | None, now: datetime
    ) -> None:
        self.counts[status] += 1
        if started is not None and (ended is not None or status == S.RUNNING.value):
            self.train_s += max(0.0, ((ended or now) - started).total_seconds())


# --- the fold ---------------------------------------------------------------------------------
Row = TypeVar("Row", Experiment, Run)


def exp_open(e: Experiment) -> bool:
    return e.status is S.QUEUED or e.status is S.RUNNING


def run_open(r: Run) -> bool:
    return r.status is RunStatus.RUNNING


@dataclass(frozen=True)
class Tracked:
    """Where a fold stands in one list of rows (experiments or runs, ascending ids)."""

    top: int = 0  # the highest id seen
    done_top: int = 0  # the highest id folded in
    open_ids: tuple[int, ...] = ()  # seen but still open (queued, running)
    pending: tuple[Any, ...] = ()  # finished, but above the lowest open id: not folded yet


def _news(rows: Sequence[Row], at: Tracked, is_open: Callable[[Row], bool]
          ) -> tuple[list[Row], list[Row], Tracked] | None:
    """(rows to fold in now, in id order: the finished ones below the lowest open id; rows
    open now; where that leaves the fold), or None when an open row is gone. A row that
    finishes while a lower id is still open waits in `pending` (drawn, not folded), so rows
    are folded in id order however they finish."""
    ids = _Ids(rows)
    was_open: list[Row | None] = [ids.find(i) for i in at.open_ids]
    if any(r is None for r in was_open):
        return None
    news: list[Row] = [r for r in was_open if r is not None]
    news += at.pending
    news += rows[bisect.bisect_right(ids, at.top):]
    news.sort(key=lambda r: r.id)
    still = [r for r in news if is_open(r)]
    low = still[0].id if still else None
    settle = [r for r in news if not is_open(r) and (low is None or r.id < low)]
    pending = tuple(r for r in news if low is not None and r.id > low and not is_open(r))
    if settle and settle[0].id <= at.done_top:
        return None  # not expected: folded rows are below every open one
    top = max(rows[-1].id if rows else 0, at.top)
    done_top = settle[-1].id if settle else at.done_top
    return settle, still, Tracked(top, done_top, tuple(r.id for r in still), pending)


class _Ids(Sequence[int]):
    """The ids of rows in ascending id order, for bisect (no list of ids is built)."""

    def __init__(self, rows: Sequence[Experiment] | Sequence[Run]) -> None:
        self.rows = rows

    def __getitem__(self, i: int) -> int:  # type: ignore[override]
        return self.rows[i].id

    def __len__(self) -> int:
        return len(self.rows)

    def find(self, row_id: int) -> Any:
        i = bisect.bisect_left(self, row_id)
        return self.rows[i] if i < len(self.rows) and self.rows[i].id == row_id else None


@dataclass(frozen=True)
class Parts:
    """The running state of each part: shared between folds until `copy`."""

    rollup: Rollup  # finished experiments' counts and training time
    plot: PlotFold
    evidence: EvidenceFold
    digest: DigestFold

    def copy(self) -> Parts:
        return Parts(Rollup(self.rollup.counts.copy(), self.rollup.train_s),
                     self.plot.copy(), self.evidence.copy(), self.digest.copy())

    def add(self, runs: Sequence[Run], exps: Sequence[Experiment]) -> None:
        now = utcnow()
        for r in runs:
            self.evidence.add_run(r)
        for e in exps:
            self.rollup.add(e.status.value, e.run_started_at, e.run_ended_at, now)
            self.plot.add(e)
            self.evidence.add_experiment(e)
            self.digest.add(e)


@dataclass(frozen=True)
class SweepFold:
    """The running state behind one sweep's summary, and the parts drawn from it."""

    key: Hashable  # fold_key of the sweep it was folded for
    full_reads: int  # the history's full reads when folded
    exps: Tracked
    runs: Tracked
    settled: Parts  # the rows folded in
    open_experiments: tuple[Experiment, ...]
    folds: int = 0  # advances folded in since it was built from the whole history

    @functools.cached_property
    def parts(self) -> Parts:
        """The settled parts with the pending rows added (a copy), or the settled ones."""
        if not self.exps.pending and not self.runs.pending:
            return self.settled
        out = self.settled.copy()
        out.add(self.runs.pending, self.exps.pending)
        return out

    def rollup_now(self) -> Rollup:
        """The rollup with the open rows counted (their time left out)."""
        done = self.parts.rollup
        r, now = Rollup(done.counts.copy(), done.train_s), utcnow()
        for e in self.open_experiments:
            started = None if e.status is S.RUNNING else e.run_started_at
            r.add(e.status.value, started, e.run_ended_at, now)
        return r

    def sweep_evidence(self, sweep: Sweep) -> SweepEvidence:
        return self.parts.evidence.evidence(list(self.open_experiments), sweep)

    def insights(self, sweep: Sweep) -> Insights:
        return self.parts.digest.insights(sweep, list(self.open_experiments))

    def plot(self) -> PlotFold:
        return self.parts.plot


def fold_key(sweep: Sweep) -> Hashable:
    """What the folded state depends on of the sweep itself: the direction (gains). The best
    and baseline are not folded (gains are against each run's own best_before; the plot,
    evidence and digest read the sweep's best when drawn), so a keep folds in like any finish."""
    return sweep.direction


def build(sweep: Sweep, history: SweepHistory) -> SweepFold:
    """A fold of the whole history."""
    empty = SweepFold(fold_key(sweep), history.full_reads, Tracked(), Tracked(),
                      Parts(Rollup(), PlotFold(), EvidenceFold(sweep),
                            DigestFold(sweep.direction)), ())
    made = _folded(empty, sweep, history, copy=False)
    assert made is not None  # nothing was open or folded before
    return made


def advance(fold: SweepFold | None, sweep: Sweep, history: SweepHistory) -> SweepFold:
    """`fold` moved on to `history` (a new SweepFold; `fold` is not changed), or a new one
    built from the whole history where the rows that changed cannot be folded in."""
    if fold is None or fold.key != fold_key(sweep) or fold.full_reads != history.full_reads:
        return build(sweep, history)
    return _folded(fold, sweep, history, copy=True) or build(sweep, history)


def _folded(fold: SweepFold, sweep: Sweep, history: SweepHistory, copy: bool
            ) -> SweepFold | None:
    exps = _news(history.experiments, fold.exps, exp_open)
    runs = _news(history.runs, fold.runs, run_open)
    if exps is None or runs is None:
        return None
    settled = fold.settled
    if exps[0] or runs[0] or not copy:
        settled = settled.copy() if copy else settled
        settled.add(runs[0], exps[0])
    return SweepFold(fold.key, history.full_reads, exps[2], runs[2], settled, tuple(exps[1]),
                     fold.folds + copy)
