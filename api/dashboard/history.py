"""A sweep's experiments (diffs included) and runs, kept per store and refreshed by what changed.

The sweep page's digest, evidence and plot are drawn from every experiment and run of the sweep;
reading them all again after each finish was most of a 10,000-experiment page (~0.5 s of rows
and diffs). Finished experiments never change (agent.core.ports.Reads.sweep_version) and ended runs
change only their ok/suspect verdict, so a refresh reads just the rows added since the last read
and those that were still open (queued, running) then: a finish costs a few rows, not the sweep.
A refresh checks what it holds against the store's version (counts per finished status, runs per
ended status with their highest id) and reads everything again if they differ (a flipped verdict,
a row that went away), so what it returns is always what a full read would have returned. What
it holds is counted as it refreshes (Held: the fresh rows are added to the counts), so a refresh
makes no pass over the sweep either.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from agent.core.domain import Experiment, ExperimentStatus, Run, RunStatus
from db.reads import Reads

PER_STORE = 4  # sweeps held per store (a 10,000-experiment sweep is ~10 MB with its diffs)
MAX_OPEN = 1000  # more open rows than this: read the sweep again rather than list their ids


@dataclass(frozen=True)
class Held:
    """What a history holds of one list of rows, kept as it is refreshed (a refresh adds its
    fresh rows, not a pass over the sweep): the finished rows per key and the highest id per
    key (experiments: (status, crash kind); runs: status), and the open rows' ids."""

    counts: Counter[Any]
    tops: dict[Any, int]
    open_ids: frozenset[int]

    def plus(self, rows: Sequence[Experiment] | Sequence[Run]) -> Held:
        """This, with `rows` (finished since, or newer) added."""
        counts, tops, opened = self.counts.copy(), dict(self.tops), []
        for r in rows:
            k = _key(r)
            if k is None:
                opened.append(r.id)
            else:
                counts[k] += 1
                tops[k] = max(tops.get(k, 0), r.id)
        return Held(counts, tops, frozenset(opened))


EMPTY = Held(Counter(), {}, frozenset())


def _key(row: Experiment | Run) -> Any:
    """The row's key in Held, or None while it is open (queued, running)."""
    st = row.status
    if isinstance(row, Run):
        return None if st is RunStatus.RUNNING else st
    if st is ExperimentStatus.QUEUED or st is ExperimentStatus.RUNNING:
        return None
    return (st, row.crash_kind)


@dataclass(frozen=True)
class SweepHistory:
    """Every experiment (with diff and reason; summary and meta empty) and run of a sweep,
    oldest first, as of `version`; `full_reads` counts the refreshes that read everything."""

    experiments: list[Experiment]
    runs: list[Run]
    version: Hashable
    full_reads: int = 0
    exps_held: Held | None = None  # None: worked out from the rows when asked
    runs_held: Held | None = None

    def held(self) -> tuple[Held, Held]:
        return (self.exps_held or EMPTY.plus(self.experiments),
                self.runs_held or EMPTY.plus(self.runs))


def experiments_version(held: Held) -> tuple[Any, ...]:
    """What Reads.sweep_version says of the experiments held: (status, crash kind or "", n)
    per finished status and kind."""
    return tuple(sorted((st.value, kind.value if kind else "", n)
                        for (st, kind), n in held.counts.items()))


def runs_version(held: Held) -> tuple[Any, ...]:
    """What Reads.sweep_version says of the runs held: (status, n, highest id) per ended
    status."""
    return tuple(sorted((st.value, n, held.tops[st]) for st, n in held.counts.items()))


def _merged(old: Sequence[Any], fresh: Sequence[Any], open_ids: frozenset[int]) -> list[Any]:
    """`old` with its open rows replaced by their fresh reads (or dropped where gone), then
    the newer rows of `fresh` (ids ascending)."""
    out, by_id = list(old), {x.id: x for x in fresh}
    gone = []
    for i in sorted(open_ids):
        at = bisect.bisect_left(out, i, key=lambda x: x.id)
        if at < len(out) and out[at].id == i:
            if i in by_id:
                out[at] = by_id.pop(i)
            else:
                gone.append(at)
    for at in reversed(gone):
        del out[at]
    return out + [x for x in fresh if x.id in by_id]


def _experiments(reads: Reads, sweep_id: int, old: SweepHistory | None
                 ) -> tuple[list[Experiment], Held]:
    if old is None:
        rows = reads.experiment_marks(sweep_id, with_diffs=True)
        return rows, EMPTY.plus(rows)
    held = old.held()[0]
    if len(held.open_ids) > MAX_OPEN:
        rows = reads.experiment_marks(sweep_id, with_diffs=True)
        return rows, EMPTY.plus(rows)
    last = old.experiments[-1].id if old.experiments else 0
    fresh = reads.experiment_marks(sweep_id, with_diffs=True, after_id=last,
                                   ids=set(held.open_ids))
    return _merged(old.experiments, fresh, held.open_ids), _without_open(held).plus(fresh)


def _runs(reads: Reads, sweep_id: int, old: SweepHistory | None) -> tuple[list[Run], Held]:
    if old is None:
        rows = reads.store.run_metrics(sweep_id)
        return rows, EMPTY.plus(rows)
    held = old.held()[1]
    if len(held.open_ids) > MAX_OPEN:
        rows = reads.store.run_metrics(sweep_id)
        return rows, EMPTY.plus(rows)
    last = old.runs[-1].id if old.runs else 0
    fresh = reads.store.run_metrics(sweep_id, after_id=last, ids=set(held.open_ids))
    return _merged(old.runs, fresh, held.open_ids), _without_open(held).plus(fresh)


def _without_open(held: Held) -> Held:
    return Held(held.counts, held.tops, frozenset())


def refresh(reads: Reads, sweep_id: int, version: tuple[Any, Any],
            old: SweepHistory | None) -> SweepHistory:
    """The sweep's history at `version` (Reads.sweep_version), from `old` plus what changed."""
    if old is not None and old.version == version:
        return old
    (exps, e_held), (runs, r_held) = _experiments(reads, sweep_id, old), _runs(reads, sweep_id, old)
    full = old.full_reads if old else 0
    if old is not None and experiments_version(e_held) != version[0]:
        exps, full = reads.experiment_marks(sweep_id, with_diffs=True), full + 1
        e_held = EMPTY.plus(exps)
    if old is not None and runs_version(r_held) != version[1]:
        runs, full = reads.store.run_metrics(sweep_id), full + 1
        r_held = EMPTY.plus(runs)
    return SweepHistory(exps, runs, version, full + (old is None), e_held, r_held)


class HistoryCache:
    """The latest SweepHistory per store and sweep (weakly keyed by the store)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_store: WeakKeyDictionary[Any, dict[int, SweepHistory]] = WeakKeyDictionary()

    def get(self, reads: Reads, sweep_id: int, version: tuple[Any, Any]) -> SweepHistory:
        with self._lock:
            old = self._by_store.setdefault(reads, {}).get(sweep_id)
        new = refresh(reads, sweep_id, version, old)
        with self._lock:
            entries = self._by_store.setdefault(reads, {})
            entries.pop(sweep_id, None)
            entries[sweep_id] = new
            while len(entries) > PER_STORE:
                entries.pop(next(iter(entries)))
        return new
