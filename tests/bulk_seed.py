"""Bulk rows for the big-table tests and benchmarks: finished experiments written straight into
a migrated database, SQLite (sqlite3's executemany) or PostgreSQL (psycopg 3's COPY FROM STDIN
with explicit ids, then setval and ANALYZE): 100,000 rows in seconds, 1,000,000 in a minute or
two, not hours through the store.

The rows look like a real night's: the baseline kept, then single-knob changes kept when they
beat the best (~5 %), discarded otherwise, ~8 % crashed (fundamental) and ~2 % timeouts, with
summaries, run times and (optionally) one screen run each. The sweep's best and the maintained
counts are set afterwards, as the store would have left them.
"""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    case,
    create_engine,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.orm import Session

from agent.core.domain import utcnow
from db.location import DbLocation
from db.models import ExperimentCountRow, ExperimentRow, RunCountRow, RunRow

KNOBS = ("LR", "WIDTH", "DEPTH", "DROPOUT", "WARMUP")
FMT = "%Y-%m-%d %H:%M:%S.%f"
EXP_COLS = ("sweep_id", "attempt", "is_baseline", "priority", "proposer", "description", "diff",
            "status", "crash_kind", "reason", "commit", "metric", "best_before", "summary",
            "meta", "llm_tokens_in", "llm_tokens_out", "llm_usd", "created_at", "started_at",
            "finished_at", "run_started_at", "run_ended_at")
# One run per loaded experiment: the baseline's role 'baseline', the others' 'screen' (%s: the
# sweep, then the newest id before the load).
RUNS_SQL = ('INSERT INTO runs (sweep_id, experiment_id, "commit", seed, role, status, metric, '
            "summary, training_s, total_s, started_at, ended_at) SELECT sweep_id, id, "
            "\"commit\", 42, CASE WHEN is_baseline THEN 'baseline' ELSE 'screen' END, "
            "CASE WHEN metric IS NULL THEN 'failed' ELSE 'ok' END, metric, summary, 300.1, "
            "310.0, run_started_at, run_ended_at FROM experiments WHERE sweep_id = %s AND id > %s")
Row = tuple[object, ...]


def _diff(i: int, rng: random.Random) -> tuple[str, str]:
    knob = KNOBS[i % len(KNOBS)]
    old, new = rng.randint(1, 99), rng.randint(1, 99)
    diff = (f"--- a/train.py\n+++ b/train.py\n@@ -9,3 +9,3 @@\n from prepare import score\n"
            f"-{knob} = {old}\n+{knob} = {new}\n WIDTH = 64\n")
    return f"{knob} {old} -> {new} (change {i})", diff


def _record(i: int, status: str, metric: float | None, best: float) -> dict[str, Any]:
    """Its verdict's record (agent.core.record), as the loop writes it: one run of its own,
    compared with one run of the best."""
    if metric is None:
        return {"verdict": {"ending": status, "change": {"runs": [], "values": []}}}
    if i == 0:
        return {"verdict": {"ending": "baseline", "change": {"runs": [], "values": [metric]}}}
    ending = "kept" if status == "kept" else "not better"
    return {"verdict": {"ending": ending, "change": {"runs": [], "values": [metric]},
                        "incumbent": {"runs": [], "values": [best]},
                        "best": {"runs": [], "values": [best]}, "difference": metric - best,
                        "se": 0.007}}


def _rows(sweep_id: int, n: int, rng: random.Random, commit: str,
          start: datetime | None = None) -> Iterator[Row]:
    best = 1.3
    start = start or utcnow() - timedelta(minutes=5 * n)
    for i in range(n):
        t0 = start + timedelta(minutes=5 * i)
        t1 = t0 + timedelta(minutes=5)
        desc, diff = ("baseline", "") if i == 0 else _diff(i, rng)
        roll = rng.random()
        kind = reason = metric = None
        if i > 0 and roll < 0.08:
            status, kind, reason = "crashed", "fundamental", "out of memory"
        elif i > 0 and roll < 0.10:
            status, kind, reason = "timeout", "timeout", "killed at the hard limit"
        else:
            metric = best if i == 0 else best + rng.gauss(0.008, 0.005)
            status = "kept" if i == 0 or metric < best else "discarded"
        summary = {} if metric is None else {"val_bpb": metric, "training_seconds": 300.1,
                                             "peak_memory_mb": 45060.2}
        yield (sweep_id, 0, i == 0, 0, "knobs", desc, diff, status, kind, reason, commit,
               metric, None if i == 0 else best, json.dumps(summary),
               json.dumps(_record(i, status, metric, best)), 0, 0, 0.0,
               t0.strftime(FMT), t0.strftime(FMT), t1.strftime(FMT), t0.strftime(FMT),
               t1.strftime(FMT))
        if status == "kept":
            best = metric  # type: ignore[assignment]


def seed(db: DbLocation | Path | str, sweep_id: int, n: int, *, rng_seed: int = 0,
         runs: bool = False, commit: str = "0" * 40, start: datetime | None = None) -> None:
    """Append `n` finished experiments (and with `runs`, one run each) to sweep `sweep_id` of
    the migrated database at `db` (a SQLite path or a postgresql:// URL); then set the sweep's
    best and rebuild the counts. `start` is the first row's creation time (default: `n` five
    minute runs before now)."""
    location = DbLocation.parse(db)
    rows = _rows(sweep_id, n, random.Random(rng_seed), commit, start)
    if location.path is not None:
        _seed_sqlite(location.path, sweep_id, rows, runs=runs, commit=commit)
    else:
        _seed_postgres(location, sweep_id, rows, runs=runs, commit=commit)
    engine = create_engine(location.url)
    try:
        with engine.begin() as conn:
            rebuild_counts(conn)
        if location.pg_url is not None:  # the planner's statistics, for the copied rows
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("ANALYZE")
    finally:
        engine.dispose()


def _seed_sqlite(db: Path, sweep_id: int, rows: Iterable[Row], *, runs: bool, commit: str) -> None:
    con = sqlite3.connect(db)
    try:
        before = con.execute("SELECT COALESCE(MAX(id), 0) FROM experiments").fetchone()[0]
        con.executemany(f"INSERT INTO experiments ({', '.join(map(_q, EXP_COLS))}) "
                        f"VALUES ({', '.join('?' * len(EXP_COLS))})", rows)
        if runs:
            con.execute(RUNS_SQL.replace("%s", "?"), (sweep_id, before))
        _set_best(con.execute, sweep_id, commit, "?")
        con.commit()
    finally:
        con.close()


def _seed_postgres(db: DbLocation, sweep_id: int, rows: Iterable[Row], *, runs: bool,
                   commit: str) -> None:
    """COPY with ids taken past both the sequence and the table's newest id, then the sequence
    set past them (the server's next insert gets a fresh id); one transaction."""
    import psycopg

    assert db.pg_url is not None
    url = db.pg_url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url) as con:
        seq = con.execute("SELECT pg_get_serial_sequence('experiments', 'id')").fetchone()[0]
        first = con.execute(f"SELECT GREATEST((SELECT COALESCE(MAX(id), 0) FROM experiments), "
                            f"(SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM "
                            f"{seq})) + 1").fetchone()[0]
        cols = ", ".join(map(_q, ("id", *EXP_COLS)))
        last = first - 1
        with con.cursor().copy(f"COPY experiments ({cols}) FROM STDIN") as copy:
            for last, row in enumerate(rows, start=first):
                copy.write_row((last, *row))
        if last >= first:
            con.execute("SELECT setval(%s, %s)", (seq, last))
        if runs:
            con.execute(RUNS_SQL, (sweep_id, first - 1))
        _set_best(con.execute, sweep_id, commit, "%s")


def _set_best(execute: Any, sweep_id: int, commit: str, mark: str) -> None:
    """The sweep's best (its newest kept row) and baseline metric, as the store leaves them."""
    best = execute(f"SELECT id, metric FROM experiments WHERE sweep_id = {mark} AND status = "
                   "'kept' ORDER BY id DESC LIMIT 1", (sweep_id,)).fetchone()
    base = execute(f"SELECT metric FROM experiments WHERE sweep_id = {mark} AND is_baseline "
                   "ORDER BY id LIMIT 1", (sweep_id,)).fetchone()
    execute(f"UPDATE sweeps SET best_experiment_id = {mark}, best_metric = {mark}, "
            f"best_commit = {mark}, baseline_metric = {mark} WHERE id = {mark}",
            (*best, commit, base[0], sweep_id))


def _q(col: str) -> str:
    return f'"{col}"'


def seed_sweep(root: Path, n: int, *, name: str = "big", rng_seed: int = 0) -> Path:
    """A sweep on a real git target (tests/fixtures/fake_target) whose `n` experiments, runs
    included, are bulk rows; returns the database path (root/<name>.db)."""
    from browser_helpers import make_target

    from agent.core.config import load_config
    from agent.git.repo import GitRepo
    from agent.ops.sweeps import create_sweep
    from db.engine import open_database
    from db.store import SqlStore

    target = make_target(root)
    db = root / f"{name}.db"
    engine = open_database(db)
    repo = GitRepo(target)
    sweep = create_sweep(SqlStore(engine), repo, target, name=name, config=load_config(target),
                         max_experiments=n)
    engine.dispose()
    con = sqlite3.connect(db)
    con.execute("DELETE FROM experiments WHERE sweep_id = ?", (sweep.id,))  # its queued baseline
    con.commit()
    con.close()
    seed(db, sweep.id, n, rng_seed=rng_seed, runs=True, commit=repo.head(sweep.branch))
    return db


def span_seconds(dialect: str) -> ColumnElement[Any]:
    """An experiment's run seconds (end − start; 0 when negative or either time is missing)
    as SQL: PostgreSQL subtracts timestamps, SQLite (ISO text) goes through julianday."""
    e = ExperimentRow
    if dialect == "postgresql":
        span: Any = func.extract("epoch", e.run_ended_at - e.run_started_at)
    else:
        span = (func.julianday(e.run_ended_at) - func.julianday(e.run_started_at)) * 86400.0
    both = e.run_started_at.is_not(None) & e.run_ended_at.is_not(None)
    return case((both & (span > 0), span), else_=0.0)


def rebuild_counts(conn: Connection | Session) -> None:
    """Recount every sweep's experiments and run seconds, and its runs, from the rows (replaces
    what db.counts' tables held): rows copied in bypass the store's `bump`."""
    conn.execute(delete(RunCountRow))
    conn.execute(insert(RunCountRow).from_select(
        ["sweep_id", "status", "n"],
        select(RunRow.sweep_id, RunRow.status, func.count())
        .group_by(RunRow.sweep_id, RunRow.status)))
    e = ExperimentRow
    kind = func.coalesce(e.crash_kind, "")
    span = span_seconds(conn.get_bind().dialect.name if isinstance(conn, Session)
                        else conn.dialect.name)
    conn.execute(delete(ExperimentCountRow))
    conn.execute(insert(ExperimentCountRow).from_select(
        ["sweep_id", "status", "crash_kind", "n", "run_s"],
        select(e.sweep_id, e.status, kind, func.count(), func.sum(span))
        .group_by(e.sweep_id, e.status, kind)))
