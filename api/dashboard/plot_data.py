"""What the sweep's progress plot draws, as data: its points (run number, experiment), the
buckets of consecutive runs a large plot is downsampled to, and PlotFold, the running state a
finish adds its point to (api/dashboard/fold.py). plot.py draws it.

Buckets are a power of two runs wide (BucketFold.width), aligned at run 1: as a sweep grows they
only merge in pairs, so the lowest and highest run of each (and its first crash and timeout)
can be kept as running state and equal what bucketing the whole sweep gives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agent.core.domain import RAN_STATUSES, Experiment, ExperimentStatus

BUCKETS = 160  # buckets of consecutive runs when downsampled (~5.5 px each)
RUNS = RAN_STATUSES


@dataclass(frozen=True)
class PlotPoint:
    n: int  # run number within the sweep (x)
    exp: Experiment


@dataclass(frozen=True)
class Envelope:
    """The non-kept scored runs n_lo..n_hi of one bucket: their lowest and highest metric."""

    n_lo: int
    n_hi: int
    lo: float
    hi: float


def best_then(e: Experiment) -> float | None:
    """The best an experiment's comparison was against (its record's), a baseline's own value
    at its verdict; None when it has neither."""
    if e.is_baseline:
        return e.metric if e.status is ExperimentStatus.KEPT else None
    record = e.record
    if record is None or record.best is None:
        return None
    return record.best.mean


def scored(p: PlotPoint) -> bool:
    m = p.exp.metric
    return m is not None and math.isfinite(m) and p.exp.status in (
        ExperimentStatus.KEPT, ExperimentStatus.DISCARDED)


class Bucket:
    """One bucket of consecutive runs: its lowest and highest non-kept scored run (the first of
    equals), their first and last run number, and the first run of each unscored status."""

    __slots__ = ("low", "high", "n_lo", "n_hi", "firsts")

    def __init__(self) -> None:
        self.low: PlotPoint | None = None
        self.high: PlotPoint | None = None
        self.n_lo = self.n_hi = 0
        self.firsts: dict[str, PlotPoint] = {}

    def add(self, p: PlotPoint) -> None:
        if scored(p):
            m = p.exp.metric
            if self.low is None or self.high is None:
                self.low = self.high = p
                self.n_lo = p.n
            elif m < self.low.exp.metric:  # type: ignore[operator]
                self.low = p
            elif m > self.high.exp.metric:  # type: ignore[operator]
                self.high = p
            self.n_hi = p.n
        else:
            self.firsts.setdefault(p.exp.status.value, p)

    def merged(self, right: Bucket) -> Bucket:
        """This bucket followed by `right` (the earlier of equal extremes wins)."""
        out = Bucket()
        out.firsts = {**right.firsts, **self.firsts}
        if self.low is None or self.high is None:
            out.low, out.high, out.n_lo, out.n_hi = right.low, right.high, right.n_lo, right.n_hi
            return out
        out.low, out.high, out.n_lo, out.n_hi = self.low, self.high, self.n_lo, self.n_hi
        if right.low is not None and right.high is not None:
            if right.low.exp.metric < self.low.exp.metric:  # type: ignore[operator]
                out.low = right.low
            if right.high.exp.metric > self.high.exp.metric:  # type: ignore[operator]
                out.high = right.high
            out.n_hi = right.n_hi
        return out


class Buckets:
    """A plot's buckets as running state: `add` run numbers in order; the width doubles (and
    neighbouring buckets merge) as the runs outgrow `count` buckets."""

    def __init__(self, count: int = BUCKETS) -> None:
        self.count, self.width, self.n_max = count, 1, 0
        self.by_index: dict[int, Bucket] = {}

    def add(self, p: PlotPoint) -> None:
        self.n_max = p.n
        while -(-self.n_max // self.width) > self.count:
            self._double()
        if p.exp.status is not ExperimentStatus.KEPT:
            b = (p.n - 1) // self.width
            found = self.by_index.get(b)  # possibly shared with a copy: changed as a copy
            found = self.by_index[b] = Bucket() if found is None else _copied(found)
            found.add(p)

    def _double(self) -> None:
        merged: dict[int, Bucket] = {}
        for b in sorted(self.by_index):
            have = merged.get(b // 2)
            merged[b // 2] = self.by_index[b] if have is None else have.merged(self.by_index[b])
        self.width *= 2
        self.by_index = merged

    def copy(self) -> Buckets:
        """A copy to append to (a bucket is replaced, never changed, by `add`)."""
        out = Buckets(self.count)
        out.width, out.n_max = self.width, self.n_max
        out.by_index = dict(self.by_index)
        return out

    def drawn(self, kept: Sequence[PlotPoint]) -> tuple[list[PlotPoint], list[Envelope]]:
        keep = {p.n: p for p in kept}
        envelopes = []
        for b in sorted(self.by_index):
            x = self.by_index[b]
            if x.low is not None and x.high is not None:
                keep[x.low.n], keep[x.high.n] = x.low, x.high
                envelopes.append(Envelope(x.n_lo, x.n_hi, x.low.exp.metric,  # type: ignore[arg-type]
                                          x.high.exp.metric))  # type: ignore[arg-type]
        for b in sorted(self.by_index):
            for p in self.by_index[b].firsts.values():
                keep[p.n] = p
        return [keep[n] for n in sorted(keep)], envelopes


def _copied(b: Bucket) -> Bucket:
    out = Bucket()
    out.low, out.high, out.n_lo, out.n_hi, out.firsts = b.low, b.high, b.n_lo, b.n_hi, \
        dict(b.firsts)
    return out


def downsample(points: Sequence[PlotPoint], buckets: int = BUCKETS
               ) -> tuple[list[PlotPoint], list[Envelope]]:
    """Every kept point; of the others, per bucket of consecutive run numbers (its width
    runs each), the lowest and the highest scored one and the first of each unscored status
    (crash, timeout, no metric); with each bucket's envelope of its non-kept scored metrics.
    Points stay in run order."""
    state = Buckets(buckets)
    for p in points:
        state.add(p)
    return state.drawn([p for p in points if p.exp.status is ExperimentStatus.KEPT])


class PlotFold:
    """What the progress plot draws of a sweep, as running state: `add` finished experiments in
    id order (others are skipped), `copy` before adding to one that is shared. The run numbers,
    kept points and buckets of the rest only grow, so a finish costs its
    own points, not the sweep's."""

    def __init__(self) -> None:
        self.points: list[PlotPoint] = []
        # (run number, the best its comparison was against): where the best line steps
        self.steps: list[tuple[int, float]] = []
        self.kept: list[PlotPoint] = []  # scored kept points
        self.kept_all: list[PlotPoint] = []  # every kept point, scored or not
        self.buckets = Buckets()
        self.labels: dict[int, tuple[str, str]] = {}  # id → (metric name, tooltip): plot.py

    def add(self, e: Experiment) -> None:
        if e.status not in RUNS:
            return
        p = PlotPoint(len(self.points) + 1, e)
        self.points.append(p)
        then = best_then(e)
        if then is not None and (not self.steps or self.steps[-1][1] != then):
            self.steps.append((p.n, then))
        if e.status is ExperimentStatus.KEPT:
            self.kept_all.append(p)
        if scored(p) and e.status is ExperimentStatus.KEPT:
            self.kept.append(p)
        self.buckets.add(p)

    def copy(self) -> PlotFold:
        out = PlotFold()
        out.labels = self.labels  # shared: a finished experiment's label does not change
        out.points, out.kept, out.kept_all = list(self.points), list(self.kept), \
            list(self.kept_all)
        out.steps = list(self.steps)
        out.buckets = self.buckets.copy()
        return out
