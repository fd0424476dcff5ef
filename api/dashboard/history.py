"""A sweep's experiments (diffs included) and runs, kept per store and refreshed by what changed.

The sweep page's digest, evidence and plot are drawn from every experiment and run of the sweep;
reading them all again after each finish was most of a 10,000-experiment page (~0.5 s of rows
and diffs). Finished experiments never change (agent.ports.Store.sweep_version) and ended runs
change only their ok/suspect verdict, so a refresh reads just the rows added since the last read
and those that were still open (queued, running) then: a finish costs a few rows, not the sweep.
A refresh checks what it holds against the store's version (counts per finished status, runs per
ended status with their highest id) and reads everything again if they differ (a flipped verdict,
a row that went away), so what it returns is always what a full read would have returned.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

from agent.domain import Experiment, Run, RunStatus
from agent.ports import Store

PER_STORE = 4  # sweeps held per store (a 10,000-experiment sweep is ~10 MB with its diffs)
MAX_OPEN = 1000  # more open rows than this: read the sweep again rather than list their ids


@dataclass(frozen=True)
class SweepHistory:
    """Every experiment (with diff and reason; summary and meta empty) and run of a sweep,
    oldest first, as of `version`; `full_reads` counts the refreshes that read everything."""

    experiments: list[Experiment]
    runs: list[Run]
    version: Hashable
    full_reads: int = 0


def experiments_version(experiments: Sequence[Experiment]) -> tuple[Any, ...]:
    """What Store.sweep_version says of these experiments: (status, crash kind or "", n) per
    finished status and kind."""
    n = Counter((e.status, e.crash_kind) for e in experiments)  # enums: .value is slow
    return tuple(sorted((st.value, kind.value if kind else "", k) for (st, kind), k in n.items()
                        if st.is_finished()))


def runs_version(runs: Sequence[Run]) -> tuple[Any, ...]:
    """What Store.sweep_version says of these runs: (status, n, highest id) per ended status."""
    n: Counter[RunStatus] = Counter(r.status for r in runs)
    top: dict[RunStatus, int] = {r.status: r.id for r in runs}  # ids ascend: the last wins
    return tuple(sorted((st.value, n[st], top[st]) for st in n if st is not RunStatus.RUNNING))


def _merged(old: Sequence[Any], fresh: Sequence[Any], open_ids: set[int]) -> list[Any]:
    """`old` without its open rows, then the fresh reads of those and of the newer ones."""
    kept = [x for x in old if x.id not in open_ids] if open_ids else list(old)
    if open_ids and fresh and kept and fresh[0].id < kept[-1].id:
        return sorted([*kept, *fresh], key=lambda x: x.id)
    return [*kept, *fresh]


def _experiments(store: Store, sweep_id: int, old: SweepHistory | None) -> list[Experiment]:
    if old is None:
        return store.experiment_marks(sweep_id, with_diffs=True)
    open_ids = {e.id for e in old.experiments if not e.status.is_finished()}
    if len(open_ids) > MAX_OPEN:
        return store.experiment_marks(sweep_id, with_diffs=True)
    last = old.experiments[-1].id if old.experiments else 0
    fresh = store.experiment_marks(sweep_id, with_diffs=True, after_id=last, ids=open_ids)
    return _merged(old.experiments, fresh, open_ids)


def _runs(store: Store, sweep_id: int, old: SweepHistory | None) -> list[Run]:
    if old is None:
        return store.run_metrics(sweep_id)
    open_ids = {r.id for r in old.runs if r.status is RunStatus.RUNNING}
    if len(open_ids) > MAX_OPEN:
        return store.run_metrics(sweep_id)
    last = old.runs[-1].id if old.runs else 0
    return _merged(old.runs, store.run_metrics(sweep_id, after_id=last, ids=open_ids),
                   open_ids)


def refresh(store: Store, sweep_id: int, version: tuple[Any, Any],
            old: SweepHistory | None) -> SweepHistory:
    """The sweep's history at `version` (Store.sweep_version), from `old` plus what changed."""
    if old is not None and old.version == version:
        return old
    exps, runs = _experiments(store, sweep_id, old), _runs(store, sweep_id, old)
    full = old.full_reads if old else 0
    if old is not None and experiments_version(exps) != version[0]:
        exps, full = store.experiment_marks(sweep_id, with_diffs=True), full + 1
    if old is not None and runs_version(runs) != version[1]:
        runs, full = store.run_metrics(sweep_id), full + 1
    return SweepHistory(exps, runs, version, full + (old is None))


class HistoryCache:
    """The latest SweepHistory per store and sweep (weakly keyed by the store)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_store: WeakKeyDictionary[Any, dict[int, SweepHistory]] = WeakKeyDictionary()

    def get(self, store: Store, sweep_id: int, version: tuple[Any, Any]) -> SweepHistory:
        with self._lock:
            old = self._by_store.setdefault(store, {}).get(sweep_id)
        new = refresh(store, sweep_id, version, old)
        with self._lock:
            entries = self._by_store.setdefault(store, {})
            entries.pop(sweep_id, None)
            entries[sweep_id] = new
            while len(entries) > PER_STORE:
                entries.pop(next(iter(entries)))
        return new
