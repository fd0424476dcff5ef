"""The bulk loader (tests/bulk_seed.py) writes the same sweep into SQLite and PostgreSQL: the
real app serves the same pages and counts from both, the sweep's best is set, and on
PostgreSQL the id sequence is past the copied rows and the statistics are fresh."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from browser_helpers import make_app
from bulk_seed import seed
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from test_store_contract import spec

from agent.core.domain import Proposal
from db.engine import open_database
from db.location import DbLocation
from db.store import SqlStore

N = 1500
START = datetime(2026, 1, 1, tzinfo=UTC)
PAGES: list[dict[str, Any]] = [
    {}, {"cursor": N // 2}, {"status": "kept"}, {"status": ["crashed", "timeout"]},
    {"crash_kind": "fundamental", "cursor": N // 3}, {"sweep": "big", "status": "discarded"},
]


def load(db: str, work: Path) -> dict[str, Any]:
    """A sweep (its queued row first) and N bulk rows; then what the API shows of them."""
    engine = open_database(db)
    store = SqlStore(engine)
    sweep = store.create_sweep(spec("big"))
    store.add_experiment(sweep.id, Proposal("queued first", "d0"))
    engine.dispose()
    seed(db, sweep.id, N, runs=True, start=START)
    with TestClient(make_app(db, work_dir=work)) as c:
        pages = [c.get("/experiments", params={"limit": 40, **p}).json() for p in PAGES]
        shown = c.get("/sweeps/big").json()
    engine = open_database(db)
    try:
        after = SqlStore(engine).add_experiment(sweep.id, Proposal("after the load", "d1")).id
        with engine.connect() as conn:
            runs = conn.scalar(text("SELECT COUNT(*) FROM runs"))
    finally:
        engine.dispose()
    return {"pages": pages, "sweep": shown, "next_id": after, "runs": runs}


def test_postgresql_gets_the_same_rows_as_sqlite(pg_url: str, tmp_path: Path) -> None:
    lite = load(str(tmp_path / "s.db"), tmp_path / "s-work")
    pg = load(pg_url, tmp_path / "pg-work")
    for page in lite["pages"]:
        assert page["count"] > 0 and page["data"], page
    assert pg["pages"] == lite["pages"]
    assert lite["pages"][0]["count"] == N + 1  # the queued row and the bulk rows
    assert lite["sweep"]["best_experiment_id"] is not None
    same = {k: v for k, v in lite["sweep"].items() if not k.endswith("_at")}
    assert {k: pg["sweep"][k] for k in same} == same  # the best, the counts per status
    assert pg["runs"] == lite["runs"] == N
    # The sequence was set past the copied ids: the store's next insert follows them.
    assert pg["next_id"] == lite["next_id"] == N + 2


def test_postgresql_statistics_are_fresh_after_the_load(pg_url: str) -> None:
    engine = open_database(pg_url)
    sweep = SqlStore(engine).create_sweep(spec("big"))
    engine.dispose()
    seed(pg_url, sweep.id, 500, start=START)
    engine = create_engine(DbLocation.parse(pg_url).url)
    try:
        with engine.connect() as conn:
            analyzed = conn.execute(text(
                "SELECT last_analyze IS NOT NULL, n_live_tup FROM pg_stat_user_tables "
                "WHERE relname = 'experiments'")).one()
            tuples = conn.scalar(text(
                "SELECT reltuples FROM pg_class WHERE relname = 'experiments'"))
    finally:
        engine.dispose()
    assert analyzed[0] and tuples == 500, (analyzed, tuples)
