"""Bulk rows for the big-table tests and benchmarks: finished experiments written with sqlite3's
executemany straight into a migrated database (100,000 rows in seconds, not minutes).

The rows look like a real night's: the baseline kept, then single-knob changes kept when they
beat the best (~5 %), discarded otherwise, ~8 % crashed (fundamental) and ~2 % timeouts, with
summaries, run times and (optionally) one screen run each. The sweep's best and the maintained
counts are set afterwards, as the store would have left them.
"""

from __future__ import annotations

import json
import random
import sqlite3
from datetime import timedelta
from pathlib import Path

from sqlalchemy import create_engine

from agent.domain import utcnow
from db import counts

KNOBS = ("LR", "WIDTH", "DEPTH", "DROPOUT", "WARMUP")
FMT = "%Y-%m-%d %H:%M:%S.%f"
EXP_COLS = ("sweep_id", "attempt", "is_baseline", "priority", "proposer", "description", "diff",
            "status", "crash_kind", "reason", "commit", "metric", "best_before", "summary",
            "meta", "llm_tokens_in", "llm_tokens_out", "llm_usd", "created_at", "started_at",
            "finished_at", "run_started_at", "run_ended_at")


def _diff(i: int, rng: random.Random) -> tuple[str, str]:
    knob = KNOBS[i % len(KNOBS)]
    old, new = rng.randint(1, 99), rng.randint(1, 99)
    diff = (f"--- a/train.py\n+++ b/train.py\n@@ -9,3 +9,3 @@\n from prepare import score\n"
            f"-{knob} = {old}\n+{knob} = {new}\n WIDTH = 64\n")
    return f"{knob} {old} -> {new} (change {i})", diff


def _rows(sweep_id: int, n: int, rng: random.Random, commit: str) -> list[tuple[object, ...]]:
    best, out = 1.3, []
    start = utcnow() - timedelta(minutes=5 * n)
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
        out.append((sweep_id, 0, i == 0, 0, "knobs", desc, diff, status, kind, reason, commit,
                    metric, None if i == 0 else best, json.dumps(summary), "{}", 0, 0, 0.0,
                    t0.strftime(FMT), t0.strftime(FMT), t1.strftime(FMT), t0.strftime(FMT),
                    t1.strftime(FMT)))
        if status == "kept":
            best = metric  # type: ignore[assignment]
    return out


def seed(db: Path, sweep_id: int, n: int, *, rng_seed: int = 0, runs: bool = False,
         commit: str = "0" * 40) -> None:
    """Append `n` finished experiments (and with `runs`, one run each) to sweep `sweep_id` of
    the migrated database at `db`; then set the sweep's best and rebuild the counts."""
    rows = _rows(sweep_id, n, random.Random(rng_seed), commit)
    con = sqlite3.connect(db)
    try:
        con.executemany(f"INSERT INTO experiments ({', '.join(map(_q, EXP_COLS))}) "
                        f"VALUES ({', '.join('?' * len(EXP_COLS))})", rows)
        if runs:
            con.execute(
                'INSERT INTO runs (sweep_id, experiment_id, "commit", seed, role, status, metric,'
                " summary, training_s, total_s, started_at, ended_at) SELECT sweep_id, id, "
                "\"commit\", 42, CASE WHEN is_baseline THEN 'baseline' ELSE 'screen' END, "
                "CASE WHEN metric IS NULL THEN 'failed' ELSE 'ok' END, metric, summary, 300.1, "
                "310.0, run_started_at, run_ended_at FROM experiments WHERE sweep_id = ?",
                (sweep_id,))
        best = con.execute("SELECT id, metric FROM experiments WHERE sweep_id = ? AND status = "
                           "'kept' ORDER BY id DESC LIMIT 1", (sweep_id,)).fetchone()
        base = con.execute("SELECT metric FROM experiments WHERE sweep_id = ? AND is_baseline "
                           "ORDER BY id LIMIT 1", (sweep_id,)).fetchone()
        con.execute("UPDATE sweeps SET best_experiment_id = ?, best_metric = ?, best_commit = ?, "
                    "baseline_metric = ? WHERE id = ?", (*best, commit, base[0], sweep_id))
        con.commit()
    finally:
        con.close()
    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        counts.rebuild(conn)
    engine.dispose()


def _q(col: str) -> str:
    return f'"{col}"'


def seed_sweep(root: Path, n: int, *, name: str = "big", rng_seed: int = 0) -> Path:
    """A sweep on a real git target (tests/fixtures/fake_target) whose `n` experiments, runs
    included, are bulk rows; returns the database path (root/<name>.db)."""
    from browser_helpers import make_target

    from agent.config import load_config
    from agent.gitrepo import GitRepo
    from agent.sweeps import create_sweep
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
