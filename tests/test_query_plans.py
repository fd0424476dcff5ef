"""Every query the list endpoints send reads an index range, checked with EXPLAIN QUERY PLAN.

The real app on a real SQLite file; each SQL statement the requests execute is captured at the
driver (SQLAlchemy's before_cursor_execute) and explained with its own parameters. A list
page must SEARCH an index (or, unfiltered, walk the primary key from the newest row under its
LIMIT): never a full SCAN of experiments, never a temporary B-tree to sort the matches.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import product
from pathlib import Path
from typing import Any

import pytest
from browser_helpers import make_app
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event
from test_store_pages import _workload

from api.schemas import MAX_LIMIT
from db.engine import open_database
from db.store import SqlStore

Statement = tuple[str, Any]


@contextmanager
def captured() -> Iterator[list[Statement]]:
    seen: list[Statement] = []

    def grab(_conn: Any, _cur: Any, sql: str, params: Any, _ctx: Any, _many: bool) -> None:
        seen.append((sql, params))

    event.listen(Engine, "before_cursor_execute", grab)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", grab)


def plan(db: Path, sql: str, params: Any) -> list[str]:
    con = sqlite3.connect(db)
    try:
        return [row[3] for row in con.execute(f"EXPLAIN QUERY PLAN {sql}", params or ())]
    finally:
        con.close()


def check_plans(db: Path, statements: list[Statement]) -> int:
    """Assert each SELECT on experiments uses an index range; returns how many were checked."""
    checked = 0
    for sql, params in statements:
        if not sql.lstrip().upper().startswith("SELECT") or "FROM experiments" not in sql:
            continue
        lines = plan(db, sql, params)
        detail = f"{sql}\n{params}\n{lines}"
        assert not any("TEMP B-TREE" in line for line in lines), detail
        for line in lines:
            if line.startswith("SCAN experiments"):
                # Only the unfiltered page: the primary key from the newest row, cut by LIMIT.
                assert " WHERE " not in sql and "LIMIT" in sql, detail
        checked += 1
    return checked


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plans") / "p.db"
    engine = open_database(path)
    _workload(SqlStore(engine), steps=300, seed=2)
    engine.dispose()
    return path


def test_every_api_list_query_uses_an_index(db: Path) -> None:
    sweeps = [None, "a"]
    statuses = [[], ["kept"], ["crashed", "timeout"], ["queued", "running", "cancelled"]]
    kinds = [None, "fundamental"]
    with TestClient(make_app(db)) as c, captured() as seen:
        cursors: list[int | None] = [None]
        first = c.get("/experiments", params={"limit": 5}).json()
        cursors.append(first["next_cursor"])
        assert first["count"] > 20 and first["next_cursor"] is not None
        for sweep, status, kind, cursor in product(sweeps, statuses, kinds, cursors):
            params: dict[str, Any] = {"limit": 5, "status": status}
            params.update({k: v for k, v in
                           {"sweep": sweep, "crash_kind": kind, "cursor": cursor}.items() if v})
            r = c.get("/experiments", params=params)
            assert r.status_code == 200, r.text
    assert check_plans(db, seen) >= len(sweeps) * len(statuses) * len(kinds) * 2


def test_every_time_filtered_list_query_uses_an_index(db: Path) -> None:
    """The time filter with each other filter, with and without a cursor: the page walks the
    filter's (…, id) index inside the window's id range, each end found by one seek of
    ix_experiments_created (db/keyset.py)."""
    sweeps = [None, "a"]
    statuses = [[], ["kept"], ["crashed", "timeout"]]
    kinds = [None, "fundamental"]
    with TestClient(make_app(db)) as c, captured() as seen:
        stamps = [e["created_at"] for e in c.get("/experiments", params={"limit": MAX_LIMIT})
                  .json()["data"]]
        mid, late = stamps[len(stamps) // 2], stamps[len(stamps) // 4]
        windows = [{"since": mid}, {"until": late}, {"since": mid, "until": late}]
        cursor = c.get("/experiments", params={"limit": 5, "since": mid}).json()["next_cursor"]
        assert cursor is not None and len(stamps) > 50
        for window, sweep, status, kind, cur in product(windows, sweeps, statuses, kinds,
                                                        [None, cursor]):
            params: dict[str, Any] = {"limit": 5, "status": status, **window}
            params.update({k: v for k, v in
                           {"sweep": sweep, "crash_kind": kind, "cursor": cur}.items() if v})
            r = c.get("/experiments", params=params)
            assert r.status_code == 200 and r.json()["count"] is None, r.text
    timed = [(sql, p) for sql, p in seen if "created_at" in sql and "FROM experiments" in sql]
    assert check_plans(db, timed) >= len(windows) * len(sweeps) * len(statuses) * len(kinds) * 2
    assert all("ix_experiments_created" in " ".join(plan(db, sql, p)) for sql, p in timed
               if "WHERE" in sql and "experiments.created_at" in sql)


def test_the_check_catches_a_scan(db: Path) -> None:
    """The checker itself fails on a query that has no index (so the test above can fail)."""
    with pytest.raises(AssertionError):
        check_plans(db, [("SELECT id FROM experiments WHERE description = ? "
                          "ORDER BY id DESC LIMIT 5", ("x",))])
    with pytest.raises(AssertionError):  # an IN list read in id order sorts every match
        check_plans(db, [("SELECT id FROM experiments WHERE status IN (?, ?) "
                          "ORDER BY id DESC LIMIT 5", ("kept", "crashed"))])
