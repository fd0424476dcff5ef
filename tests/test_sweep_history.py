"""The sweep page's history (api/dashboard/history.py) on the SQL stores (the pages' read models
are theirs): after any change a refresh holds exactly what a full read returns, and after a
finish it read only what changed."""

from __future__ import annotations

import pytest
from test_store_contract import STORES, make_store, spec

from agent.core.domain import (
    CrashKind,
    ExperimentStatus,
    Finish,
    Proposal,
    RunEnd,
    RunRole,
    RunSpec,
    RunStatus,
)
from api.dashboard.history import HistoryCache, SweepHistory, refresh
from db.reads import Reads as DbReads
from db.store import SqlStore

S = ExperimentStatus


@pytest.fixture(params=[s for s in STORES if s != "memory"])
def store(request, tmp_path) -> SqlStore:  # type: ignore[no-untyped-def]
    return make_store(request, tmp_path)


class Reads:
    """The pages' reads of a store, counting the whole-sweep reads (neither after_id nor ids)
    made through them: the marks (db.reads) and the run metrics (the store's)."""

    def __init__(self, store: SqlStore) -> None:
        self.real, self.whole = DbReads(store), 0
        self.store = _CountedStore(store, self)

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)

    def experiment_marks(self, sweep_id: int, with_diffs: bool = False,
                         after_id: int | None = None, ids: object = ()) -> object:
        self.whole += after_id is None and not ids
        return self.real.experiment_marks(sweep_id, with_diffs, after_id, ids)  # type: ignore[arg-type]


class _CountedStore:
    def __init__(self, store: SqlStore, counter: Reads) -> None:
        self.real, self.counter = store, counter

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)

    def run_metrics(self, sweep_id: int, after_id: int | None = None, ids: object = ()) -> object:
        self.counter.whole += after_id is None and not ids
        return self.real.run_metrics(sweep_id, after_id, ids)  # type: ignore[arg-type]


def _same_as_full(store: SqlStore, sid: int, h: SweepHistory) -> None:
    assert h.experiments == DbReads(store).experiment_marks(sid, with_diffs=True)
    assert h.runs == store.run_metrics(sid)


def _step(reads: Reads, sid: int, old: SweepHistory | None) -> SweepHistory:
    """Refresh; a history whose version did not move is kept as it is (queued and running
    rows are not what the version tracks), else it must equal a full read."""
    h = refresh(reads, sid, reads.real.sweep_version(sid), old)  # type: ignore[arg-type]
    if old is not None and h.version == old.version:
        assert h is old
    else:
        _same_as_full(reads.real.store, sid, h)
    return h


def test_a_refresh_reads_what_changed_and_matches_a_full_read(store: SqlStore):
    sid = store.create_sweep(spec()).id
    reads = Reads(store)
    first = [store.add_experiment(sid, Proposal(f"e{i}", f"d{i}")) for i in range(4)]
    h = _step(reads, sid, None)
    assert reads.whole == 2  # the first read is whole
    for i, e in enumerate(first):
        store.claim(e.id)
        run = store.start_run(RunSpec(sid, e.id, f"c{i}", 42, RunRole.SCREEN))
        h = _step(reads, sid, h)  # claimed, run started: nothing finished, nothing read
        store.end_run(run.id, RunEnd(RunStatus.OK, metric=1.0 + i))
        store.add_experiment(sid, Proposal(f"later {i}", f"x{i}"))  # a newer open row
        ends = [Finish(S.DISCARDED, metric=1.5, best_before=1.0),
                Finish(S.CRASHED, CrashKind.FUNDAMENTAL, "out of memory")]
        store.finish(e.id, ends[i % 2])
        h = _step(reads, sid, h)
    assert reads.whole == 2 and h.full_reads == 1  # every later refresh read only the changes


def test_a_flipped_verdict_or_a_row_out_of_step_reads_the_sweep_again(store: SqlStore):
    sid = store.create_sweep(spec()).id
    e = store.add_experiment(sid, Proposal("a", "d1"))
    store.claim(e.id)
    run = store.start_run(RunSpec(sid, e.id, "c1", 42, RunRole.SCREEN))
    store.end_run(run.id, RunEnd(RunStatus.OK, metric=1.0))
    store.finish(e.id, Finish(S.DISCARDED, metric=1.0, best_before=0.9))
    reads = Reads(store)
    h = _step(reads, sid, None)
    store.set_run_status(run.id, RunStatus.SUSPECT)  # an ended run, not re-read by a refresh
    h = _step(reads, sid, h)
    assert h.full_reads == 2 and h.runs[0].status is RunStatus.SUSPECT
    stale = SweepHistory([], h.runs, None)  # what it holds disagrees with the version
    again = refresh(reads, sid, DbReads(store).sweep_version(sid), stale)  # type: ignore[arg-type]
    _same_as_full(store, sid, again)


def test_the_cache_keeps_a_few_sweeps_per_store(store: SqlStore):
    cache, reads = HistoryCache(), DbReads(store)
    sids = [store.create_sweep(spec(f"s{i}")).id for i in range(6)]
    for sid in sids:
        store.add_experiment(sid, Proposal("a", "d1"))
        assert cache.get(reads, sid, reads.sweep_version(sid)).experiments[0].sweep_id == sid
    held = cache._by_store[reads]
    assert list(held) == sids[-4:]
