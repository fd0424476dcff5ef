"""Keyset pages and maintained counts, on every store (the contract suite's `store` fixture):
after a mixed workload each count equals the rows a listing returns, and walking pages with a
cursor (either way, one status or several) gives exactly the full listing."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from itertools import combinations, product

import pytest
from memory_store import MemoryStore
from sqlalchemy import text, update
from test_store_contract import STORES, make_store, reads_of, spec

from agent.core.domain import (
    CrashKind,
    Experiment,
    ExperimentStatus,
    Finish,
    Proposal,
    RunEnd,
    RunRole,
    RunSpec,
    RunStatus,
    utcnow,
)
from agent.core.errors import ConflictError, DuplicateError
from agent.core.ports import Store
from agent.rules.endings import finish_of, refused
from db.keyset import CLOCK_SLACK
from db.models import ExperimentRow
from db.reads import Reads
from db.store import SqlStore

S = ExperimentStatus


@pytest.fixture(params=STORES)
def store(request, tmp_path) -> Store:  # type: ignore[no-untyped-def]
    """Every store of the contract suite: SQLite, PostgreSQL, memory."""
    return make_store(request, tmp_path)


@pytest.fixture(params=[s for s in STORES if s != "memory"])
def sql_store(request, tmp_path) -> SqlStore:  # type: ignore[no-untyped-def]
    """The SQL stores, whose read models (db.reads) the pages use."""
    return make_store(request, tmp_path)


def briefs(store: SqlStore, sweep_id: int) -> list[Experiment]:
    """The pages' brief rows of a sweep (no log tail, meta, pgid or pruned_at), derived from
    the full listing: the oracle of the read models' index lookups."""
    return [replace(e, log_tail=None, meta={}, pgid=None, pruned_at=None)
            for e in store.list_experiments(sweep_id)]
ENDS = [(S.KEPT, None), (S.DISCARDED, None), (S.CRASHED, CrashKind.TRIVIAL),
        (S.CRASHED, CrashKind.FUNDAMENTAL), (S.TIMEOUT, CrashKind.TIMEOUT), (S.REJECTED, None),
        (S.CANCELLED, None)]


def _workload(store: Store, steps: int = 260, seed: int = 3) -> list[int]:
    """Adds (some rejected at once, some duplicates), claims, finishes of every kind, cancels
    of queued rows, and two reaps of running ones, over two sweeps."""
    rng = random.Random(seed)
    sweeps = [store.create_sweep(spec("a")).id, store.create_sweep(spec("b")).id]
    for step in range(steps):
        sid, roll = rng.choice(sweeps), rng.random()
        if roll < 0.4:
            ended = finish_of(refused("no")) if rng.random() < 0.1 else None
            try:
                store.add_experiment(sid, Proposal(f"e{step}", f"d{rng.randrange(40)}"),
                                     ended=ended, is_baseline=rng.random() < 0.05)
            except DuplicateError:
                pass
        elif roll < 0.6:
            store.claim_next(sid)
        elif roll < 0.9:
            running = store.list_experiments(sid, [S.RUNNING], limit=3)
            if running:
                status, kind = rng.choice(ENDS)
                store.finish(rng.choice(running).id, Finish(status, kind, "r"))
        elif roll < 0.98:
            queued = store.list_experiments(sid, [S.QUEUED], limit=1)
            if queued and store.claim(queued[0].id):
                store.finish(queued[0].id, Finish(S.CANCELLED, reason="cancelled"))
        elif step > steps // 3:
            store.interrupt_running()
    return sweeps


FILTER_STATUSES = [None, *([st] for st in S), [S.CRASHED, S.TIMEOUT], [S.QUEUED, S.RUNNING],
                   [S.REJECTED, S.CANCELLED, S.INTERRUPTED]]


def test_counts_equal_real_counts_after_a_mixed_workload(store: Store):
    sweeps = _workload(store)
    everything = store.list_experiments()
    assert {e.status for e in everything} >= {S.QUEUED, S.RUNNING, S.KEPT, S.CRASHED,
                                              S.INTERRUPTED, S.CANCELLED}, "a thin workload"
    for sid in [None, *sweeps]:
        for statuses in FILTER_STATUSES:
            for kind in [None, *CrashKind]:
                real = [e for e in everything if (sid is None or e.sweep_id == sid)
                        and (not statuses or e.status in statuses)
                        and (kind is None or e.crash_kind is kind)]
                assert store.count_experiments(sid, statuses, kind) == len(real), (
                    sid, statuses, kind)
                listed = store.list_experiments(sid, statuses, crash_kind=kind)
                assert [e.id for e in listed] == [e.id for e in real]
        mine = [e for e in everything if sid is None or e.sweep_id == sid]
        if (reads := reads_of(store)) is not None:
            assert reads.status_counts(sid) == dict(Counter(e.status.value for e in mine))
        assert store.count_experiments(sid, is_baseline=True) == sum(e.is_baseline for e in mine)


def test_a_refused_write_changes_no_count(store: Store):
    sid = store.create_sweep(spec()).id
    first = store.add_experiment(sid, Proposal("a", "same"))
    with pytest.raises(DuplicateError):
        store.add_experiment(sid, Proposal("b", "same"))
    store.claim(first.id)
    store.finish(first.id, Finish(S.KEPT, metric=1.0, best=1.0), keep_commit="c")
    with pytest.raises(ConflictError):
        store.finish(first.id, Finish(S.DISCARDED, metric=2.0))
    assert store.claim(first.id) is None
    assert store.count_experiments(sid, [S.KEPT]) == 1 and store.count_experiments() == 1
    if (reads := reads_of(store)) is not None:
        assert reads.status_counts(sid) == {"kept": 1}


def _walk(store: Store, newest_first: bool, limit: int, **filters) -> list[int]:  # type: ignore[no-untyped-def]
    seen: list[int] = []
    while True:
        cursor = {} if not seen else (
            {"before_id": seen[-1]} if newest_first else {"after_id": seen[-1]})
        page = store.list_experiments(**filters, newest_first=newest_first, limit=limit,
                                      **cursor)
        assert len(page) <= limit
        seen.extend(e.id for e in page)
        if len(page) < limit:
            return seen


def test_keyset_pages_walk_the_whole_listing(store: Store):
    sweeps = _workload(store, steps=160, seed=5)
    groups = [None, [S.KEPT], [S.CRASHED, S.TIMEOUT], [S.QUEUED, S.RUNNING, S.CANCELLED]]
    for sid in [None, sweeps[0]]:
        for statuses in groups:
            for kind in [None, CrashKind.TRIVIAL]:
                f = {"sweep_id": sid, "statuses": statuses, "crash_kind": kind}
                full = [e.id for e in store.list_experiments(**f)]
                for limit in (1, 7):
                    assert _walk(store, True, limit, **f) == full[::-1], (f, limit)
                    assert _walk(store, False, limit, **f) == full, (f, limit)
    ids = [e.id for e in store.list_experiments()]
    lo, hi = ids[3], ids[-3]
    assert [e.id for e in store.list_experiments(after_id=lo, before_id=hi)] == ids[4:-3]
    # A status named twice is still one page of distinct rows.
    twice = store.list_experiments(statuses=[S.KEPT, S.KEPT, S.CRASHED], limit=5)
    assert len({e.id for e in twice}) == len(twice)


def _restamp(store: Store, stamps: dict[int, datetime]) -> None:
    """Set rows' created_at (a night's spread of times, out-of-order writers)."""
    if isinstance(store, MemoryStore):
        for i, when in stamps.items():
            store._exps[i] = replace(store._exps[i], created_at=when)
        return
    with store.engine.begin() as conn:  # type: ignore[attr-defined]
        for i, when in stamps.items():
            conn.execute(update(ExperimentRow).where(ExperimentRow.id == i)
                         .values(created_at=when))


T0 = datetime(2026, 11, 28, 18, 0, tzinfo=UTC)
STEP = timedelta(minutes=10)
PLUS_2 = timezone(timedelta(hours=2))


def _night(store: Store) -> tuple[list[int], list[tuple[datetime | None, datetime | None]]]:
    """A workload stamped one row per 10 minutes, but row K+1 written 30 s *before* row K (two
    writers racing, within CLOCK_SLACK); returns the sweeps and windows to list, including
    bounds equal to a row's time and bounds between the racing pair."""
    sweeps = _workload(store, steps=160, seed=13)
    ids = [e.id for e in store.list_experiments()]
    stamps = {i: T0 + n * STEP for n, i in enumerate(ids)}
    k = ids[len(ids) // 2]
    stamps[k + 1] = stamps[k] - timedelta(seconds=30)
    _restamp(store, stamps)
    assert timedelta(seconds=30) < CLOCK_SLACK  # the race this night stages is one it covers
    at = [stamps[ids[n]] for n in (5, 17, 40)]
    edge = stamps[k] - timedelta(seconds=10)  # after row K+1's time, before row K's
    windows: list[tuple[datetime | None, datetime | None]] = [
        (at[0], None), (None, at[1]), (at[0], at[2]), (edge, None), (None, edge),
        (edge, stamps[k] + 3 * STEP), (at[1], at[1] + timedelta(microseconds=1)),
        (T0 - 10 * STEP, T0), (stamps[ids[-1]] + STEP, None),
        (at[0].astimezone(PLUS_2), at[2].astimezone(PLUS_2))]  # same instants, +02:00
    return sweeps, windows


def test_time_windows_list_and_walk_exactly_the_rows_created_in_them(store: Store):
    """since is inclusive, until exclusive, on created_at; combined with every other filter
    and walked with a cursor either way, a window gives exactly its rows in id order."""
    sweeps, windows = _night(store)
    everything = store.list_experiments()
    groups = [None, [S.KEPT], [S.CRASHED, S.TIMEOUT], [S.QUEUED, S.RUNNING, S.CANCELLED]]
    seen_rows = 0
    for (since, until), sid, statuses, kind in product(windows, [None, sweeps[0]], groups,
                                                        [None, CrashKind.TRIVIAL]):
        f = {"sweep_id": sid, "statuses": statuses, "crash_kind": kind, "since": since,
             "until": until}
        real = [e.id for e in everything if (sid is None or e.sweep_id == sid)
                and (not statuses or e.status in statuses)
                and (kind is None or e.crash_kind is kind)
                and (since is None or e.created_at >= since)
                and (until is None or e.created_at < until)]
        assert [e.id for e in store.list_experiments(**f)] == real, f
        assert _walk(store, True, 3, **f) == real[::-1], f
        assert _walk(store, False, 3, **f) == real, f
        seen_rows += len(real)
    assert seen_rows > 500, "the windows hold too few rows to test anything"


def test_a_window_edge_between_two_racing_writers_splits_them_by_time(store: Store):
    """Row K+1 was stamped before row K: a bound between their times puts K in the window
    and K+1 out (and the other way for `until`), though K+1's id is the larger."""
    _night(store)
    ids = [e.id for e in store.list_experiments()]
    k = ids[len(ids) // 2]
    edge = T0 + (len(ids) // 2) * STEP - timedelta(seconds=10)
    after = [e.id for e in store.list_experiments(since=edge, until=edge + STEP)]
    before = [e.id for e in store.list_experiments(since=edge - STEP, until=edge)]
    assert after == [k] and before == [k - 1, k + 1]


def test_counts_table_matches_a_group_by_over_the_rows(tmp_path):
    """The SQL store's counts are rows of their own: equal to a real COUNT(*) per key."""
    from db.engine import open_database
    from db.store import SqlStore

    engine = open_database(tmp_path / "c.db")
    _workload(SqlStore(engine), steps=200, seed=11)
    with engine.connect() as conn:
        kept = {(a, b, c): n for a, b, c, n in conn.execute(text(
            "SELECT sweep_id, status, crash_kind, n FROM experiment_counts")) if n}
        real = {(a, b, c): n for a, b, c, n in conn.execute(text(
            "SELECT sweep_id, status, COALESCE(crash_kind, ''), COUNT(*) FROM experiments "
            "GROUP BY 1, 2, 3"))}
    assert kept == real and sum(real.values()) > 50
    assert all(n >= 0 for n in kept.values())


def test_statuses_filter_combinations_are_disjoint_sums(store: Store):
    """Counts over several statuses are the sum of each (no key counted twice)."""
    _workload(store, steps=120, seed=7)
    for a, b in combinations(list(S), 2):
        assert store.count_experiments(statuses=[a, b]) == (
            store.count_experiments(statuses=[a]) + store.count_experiments(statuses=[b]))


def test_marks_are_the_listing_with_only_the_plot_fields(sql_store: SqlStore):
    store, reads = sql_store, Reads(sql_store)
    sid = store.create_sweep(spec()).id
    base = store.add_experiment(sid, Proposal("baseline", ""), is_baseline=True)
    store.claim(base.id)
    store.mark_started(base.id, commit="c0", base_commit="c0", run_started_at=utcnow())
    run = store.start_run(RunSpec(sid, base.id, "c0", 42, RunRole.BASELINE, "/l"))
    store.end_run(run.id, RunEnd(RunStatus.OK, metric=1.5, summary={"x": 1}))
    store.finish(base.id, Finish(S.KEPT, metric=1.5, summary={"val_bpb": 1.5},
                                 run_ended_at=utcnow(), best=1.5), keep_commit="c0")
    crash = store.add_experiment(sid, Proposal("boom", "d1"))
    store.claim(crash.id)
    store.finish(crash.id, Finish(S.CRASHED, CrashKind.FUNDAMENTAL, "oom", log_tail="t"))
    store.add_experiment(sid, Proposal("waits", "d2"))
    full = store.list_experiments(sid)
    marks = reads.experiment_marks(sid)
    fields = ("id", "sweep_id", "status", "crash_kind", "metric", "best_before", "description",
              "is_baseline", "commit", "base_commit", "run_started_at", "run_ended_at")
    assert [tuple(getattr(m, f) for f in fields) for m in marks] == [
        tuple(getattr(e, f) for f in fields) for e in full]
    assert all(m.diff == "" and m.summary == {} and m.log_tail is None for m in marks)
    with_diffs = reads.experiment_marks(sid, with_diffs=True)
    assert [(m.diff, m.reason) for m in with_diffs] == [(e.diff, e.reason) for e in full]
    assert [m.id for m in with_diffs] == [m.id for m in marks] and full[1].reason == "oom"
    [light] = store.run_metrics(sid)
    [whole] = store.list_runs(sweep_id=sid)
    keep = ("id", "sweep_id", "experiment_id", "commit", "seed", "role", "status", "metric",
            "throughput")
    assert [getattr(light, f) for f in keep] == [getattr(whole, f) for f in keep]
    assert light.summary == {} and whole.summary == {"x": 1}


def test_sweep_version_moves_when_work_finishes(sql_store: SqlStore):
    store, reads = sql_store, Reads(sql_store)
    sid, other = store.create_sweep(spec()).id, store.create_sweep(spec("t")).id
    seen = [reads.sweep_version(sid)]

    def changed(expected: bool = True) -> None:
        now = reads.sweep_version(sid)
        assert reads.sweep_version(sid) == now  # stable while nothing happens
        if expected:
            assert now not in seen
            seen.append(now)
        else:
            assert now == seen[-1]

    exp = store.add_experiment(sid, Proposal("a", "d1"))
    changed(False)  # queued, running: not finished work
    store.claim(exp.id)
    store.mark_started(exp.id, commit="c1", base_commit="c0")
    run = store.start_run(RunSpec(sid, exp.id, "c1", 42, RunRole.SCREEN))
    changed(False)
    store.add_experiment(other, Proposal("elsewhere", "d1"), ended=finish_of(refused("no")))
    changed(False)  # another sweep
    store.end_run(run.id, RunEnd(RunStatus.OK, metric=1.0))
    changed()
    store.set_run_status(run.id, RunStatus.SUSPECT)
    changed()
    store.finish(exp.id, Finish(S.DISCARDED, metric=1.0))
    changed()
    store.add_experiment(sid, Proposal("refused", "d2"), ended=finish_of(refused("no")))
    changed()
    second = store.add_experiment(sid, Proposal("b", "d3"))
    store.claim(second.id)
    changed(False)
    store.interrupt_running()
    changed()


def test_the_migration_counts_the_rows_already_there(tmp_path):
    """A database made before keyset_pages: its rows are counted by the upgrade."""
    from db.engine import make_engine, migrate
    from db.store import SqlStore

    engine = make_engine(tmp_path / "old.db")
    migrate(engine, "0003_runs")  # the schema as that release left it
    with engine.begin() as conn:
        for sid in (1, 2):
            conn.execute(text(
                "INSERT INTO sweeps (id, name, target_path, branch, status, proposer, config, "
                "protected_hashes, llm_tokens_in, llm_tokens_out, llm_usd, created_at, "
                f"updated_at) VALUES ({sid}, 's{sid}', '/t', 'overnight/s{sid}', 'running', "
                "'queue', '{}', '{}', 0, 0, 0, '2026-11-29 00:00:00', '2026-11-29 00:00:00')"))
        rows = [(1, "kept", None), (1, "crashed", "trivial"), (1, "crashed", "trivial"),
                (1, "timeout", "timeout"), (2, "queued", None), (2, "discarded", None)]
        for i, (sid, status, kind) in enumerate(rows, start=1):
            conn.execute(text(
                "INSERT INTO experiments (id, sweep_id, attempt, is_baseline, priority, "
                "proposer, description, diff, status, crash_kind, summary, meta, "
                "llm_tokens_in, llm_tokens_out, llm_usd, created_at) VALUES (:i, :s, 0, 0, 0, "
                "'knobs', 'd', '', :st, :k, '{}', '{}', 0, 0, 0, '2026-11-29 00:00:00')"),
                {"i": i, "s": sid, "st": status, "k": kind})
    migrate(engine)
    store = SqlStore(engine)
    reads = Reads(store)
    assert reads.status_counts(1) == {"kept": 1, "crashed": 2, "timeout": 1}
    assert store.count_experiments(crash_kind=CrashKind.TRIVIAL) == 2
    assert store.count_experiments(2, [S.QUEUED, S.DISCARDED]) == 2
    store.claim(5)  # and they go on being kept from there
    assert reads.status_counts(2) == {"running": 1, "discarded": 1}
    migrate(engine)  # idempotent
    assert store.count_experiments() == 6
    engine.dispose()


def test_marks_and_run_metrics_read_only_newer_rows_and_the_ids_asked_for(store: Store):
    """What a page's history refresh reads: rows after a cursor plus named (open) rows, of this
    sweep only, oldest first and each once, the same fields as a full read."""
    sid, other = store.create_sweep(spec()).id, store.create_sweep(spec("t")).id
    exps = [store.add_experiment(sid, Proposal(f"e{i}", f"d{i}")) for i in range(6)]
    elsewhere = store.add_experiment(other, Proposal("x", "d1"))
    runs = [store.start_run(RunSpec(sid, e.id, "c", 42, RunRole.SCREEN)) for e in exps]
    full_runs = store.run_metrics(sid)
    ids = [exps[1].id, exps[4].id, elsewhere.id]  # an id after the cursor too, and another sweep's
    if (reads := reads_of(store)) is not None:
        full = reads.experiment_marks(sid, with_diffs=True)
        got = reads.experiment_marks(sid, with_diffs=True, after_id=exps[3].id, ids=ids)
        assert got == [e for e in full if e.id in (exps[1].id, exps[4].id, exps[5].id)]
        assert reads.experiment_marks(sid, ids=[exps[2].id]) == [
            m for m in reads.experiment_marks(sid) if m.id == exps[2].id]
        assert reads.experiment_marks(sid, after_id=exps[5].id) == []
    assert store.run_metrics(sid, after_id=runs[4].id, ids=[runs[0].id]) == [
        full_runs[0], full_runs[5]]
    assert store.run_metrics(sid, after_id=runs[5].id) == []


def test_an_experiment_pages_lookups_agree_with_the_whole_sweep(sql_store: SqlStore):
    """Neighbours, retries and run numbers by index lookups equal what the old page derived
    from every sibling; the overview's counts and run seconds equal a walk over every row."""
    from datetime import timedelta

    store, reads = sql_store, Reads(sql_store)
    sid, other = store.create_sweep(spec()).id, store.create_sweep(spec("t")).id
    t0 = utcnow()
    rng = random.Random(5)
    for i in range(24):
        sweep = sid if i % 5 else other
        parents = [e.id for e in store.list_experiments(sweep)]
        parent = rng.choice(parents) if parents and rng.random() < 0.3 else None
        e = store.add_experiment(sweep, Proposal(f"e{i}", f"d{i}", parent_id=parent))
        if rng.random() < 0.8:
            store.claim(e.id)
            start = t0 + timedelta(seconds=i)
            store.mark_started(e.id, run_started_at=start)
            status, kind = ENDS[rng.randrange(len(ENDS) - 2)]
            if rng.random() < 0.8:
                store.finish(e.id, Finish(status, kind, run_started_at=start,
                                          run_ended_at=start + timedelta(seconds=10 + i)))
    ran = (S.KEPT, S.DISCARDED, S.CRASHED, S.TIMEOUT)
    for sweep in (sid, other):
        rows = briefs(store, sweep)
        for i, e in enumerate(rows):
            before, after = reads.adjacent_experiments(sweep, e.id)
            assert before == (rows[i - 1] if i else None)
            assert after == (rows[i + 1] if i + 1 < len(rows) else None)
            assert reads.retries_of(e.id) == [x for x in briefs(store, e.sweep_id)
                                              if x.parent_id == e.id]
            assert reads.run_number(sweep, e.id) == sum(x.status in ran for x in rows[:i + 1])
    seconds: dict[int, float] = {}
    for e in store.list_experiments():
        if e.run_started_at is not None and e.run_ended_at is not None:
            seconds[e.sweep_id] = (seconds.get(e.sweep_id, 0.0)
                                   + (e.run_ended_at - e.run_started_at).total_seconds())
    got = reads.run_seconds()
    assert got.keys() == seconds.keys() and all(
        got[k] == pytest.approx(v, abs=1e-3) for k, v in seconds.items())
    assert reads.status_counts_by_sweep() == {s: reads.status_counts(s) for s in (sid, other)}
    assert reads.adjacent_experiments(sid, 10**6) == (briefs(store, sid)[-1], None)


def test_the_migration_sums_the_run_seconds_already_there(tmp_path):
    """A database made before counts_run_seconds: its rows' run times are summed by the
    upgrade, and finishes go on adding to them."""
    from datetime import timedelta

    from db.engine import make_engine, migrate
    from db.store import SqlStore

    engine = make_engine(tmp_path / "old.db")
    migrate(engine, "experiment_parent_index")  # the schema as that release left it
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO sweeps (id, name, target_path, branch, status, proposer, config, "
            "protected_hashes, llm_tokens_in, llm_tokens_out, llm_usd, created_at, "
            "updated_at) VALUES (1, 's', '/t', 'overnight/s', 'running', 'queue', '{}', '{}', "
            "0, 0, 0, '2026-11-29 00:00:00', '2026-11-29 00:00:00')"))
        rows = [("kept", None, "00:00:10"), ("discarded", None, "00:00:20"),
                ("timeout", "timeout", "00:00:30"), ("queued", None, None),
                ("crashed", "trivial", None)]
        for i, (status, kind, end) in enumerate(rows, start=1):
            conn.execute(text(
                "INSERT INTO experiments (id, sweep_id, attempt, is_baseline, priority, "
                "proposer, description, diff, status, crash_kind, summary, meta, "
                "llm_tokens_in, llm_tokens_out, llm_usd, created_at, run_started_at, "
                "run_ended_at) VALUES (:i, 1, 0, 0, 0, 'knobs', 'd', '', :st, :k, '{}', '{}', "
                "0, 0, 0, '2026-11-29 00:00:00', '2026-11-29 00:00:00.000000', :end)"),
                {"i": i, "st": status, "k": kind,
                 "end": f"2026-11-29 {end}.000000" if end else None})
        conn.execute(text(
            "INSERT INTO experiment_counts (sweep_id, status, crash_kind, n) SELECT sweep_id, "
            "status, COALESCE(crash_kind, ''), COUNT(*) FROM experiments "
            "GROUP BY sweep_id, status, COALESCE(crash_kind, '')"))
    migrate(engine)
    store = SqlStore(engine)
    reads = Reads(store)
    assert reads.run_seconds() == {1: pytest.approx(60.0, abs=1e-3)}
    t0 = utcnow()
    store.claim(4)
    store.finish(4, Finish(S.DISCARDED, run_started_at=t0,
                           run_ended_at=t0 + timedelta(seconds=5)))
    assert reads.run_seconds() == {1: pytest.approx(65.0, abs=1e-3)}
    assert reads.status_counts(1) == {"kept": 1, "discarded": 2, "timeout": 1, "crashed": 1}


def test_the_time_index_migration_upgrades_a_database_with_rows(tmp_path):
    """A database at the revision before created_index gets the index, and its old rows are
    found by a time window (SQLite; the PostgreSQL suites migrate every database they use)."""
    from sqlalchemy import inspect

    from db.engine import make_engine, migrate
    from db.store import SqlStore

    engine = make_engine(tmp_path / "old.db")
    migrate(engine, "experiment_filter_stats")  # the revision before created_index
    store = SqlStore(engine)
    sid = store.create_sweep(spec()).id
    ids = [store.add_experiment(sid, Proposal(f"e{i}", f"d{i}")).id for i in range(6)]
    _restamp(store, {i: T0 + n * STEP for n, i in enumerate(ids)})
    assert "ix_experiments_created" not in {
        ix["name"] for ix in inspect(engine).get_indexes("experiments")}
    migrate(engine)
    assert "ix_experiments_created" in {
        ix["name"] for ix in inspect(engine).get_indexes("experiments")}
    window = store.list_experiments(since=T0 + STEP, until=T0 + 4 * STEP, newest_first=True)
    assert [e.id for e in window] == ids[1:4][::-1]
    engine.dispose()
