"""Every query the list endpoints send reads an index range, checked with EXPLAIN QUERY PLAN
on SQLite and EXPLAIN (FORMAT JSON) on PostgreSQL.

The real app on a real SQLite file; each SQL statement the requests execute is captured at the
driver (SQLAlchemy's before_cursor_execute) and explained with its own parameters. A list
page must SEARCH an index (or, unfiltered, walk the primary key from the newest row under its
LIMIT): never a full SCAN of experiments, never a temporary B-tree to sort the matches. On
PostgreSQL (a throw-away server, 20,000 bulk rows with ANALYZE'd statistics) the same requests'
statements are explained twice, as planned for their values and as a prepared statement's
generic plan: no Seq Scan on experiments, no Sort node, in either.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from itertools import product
from pathlib import Path
from typing import Any

import pytest
from browser_helpers import make_app
from bulk_seed import seed
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event
from test_store_pages import _workload

from agent.core.domain import utcnow
from api.schemas import MAX_LIMIT
from db.engine import open_database, postgres_connect_args
from db.location import DbLocation
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


def send_list_requests(c: TestClient) -> int:
    """Every filter combination of `GET /experiments`, first page and a cursor page; returns
    how many list queries that must at least be (one request can send several)."""
    sweeps = [None, "a"]
    statuses = [[], ["kept"], ["crashed", "timeout"], ["queued", "running", "cancelled"]]
    kinds = [None, "fundamental"]
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
    return len(sweeps) * len(statuses) * len(kinds) * 2


def test_every_api_list_query_uses_an_index(db: Path) -> None:
    with TestClient(make_app(db)) as c, captured() as seen:
        wanted = send_list_requests(c)
    assert check_plans(db, seen) >= wanted


def send_time_filtered_requests(c: TestClient) -> int:
    """The time filter with each other filter, with and without a cursor; returns how many
    list queries with a time window that must at least be."""
    sweeps = [None, "a"]
    statuses = [[], ["kept"], ["crashed", "timeout"]]
    kinds = [None, "fundamental"]
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
    return len(windows) * len(sweeps) * len(statuses) * len(kinds) * 2


def timed(statements: list[Statement]) -> list[Statement]:
    return [(sql, p) for sql, p in statements if "created_at" in sql and "FROM experiments" in sql]


def test_every_time_filtered_list_query_uses_an_index(db: Path) -> None:
    """The page walks the filter's (…, id) index inside the window's id range, each end found
    by one seek of ix_experiments_created (db/keyset.py), read before the page."""
    with TestClient(make_app(db)) as c, captured() as seen:
        wanted = send_time_filtered_requests(c)
    assert check_plans(db, timed(seen)) >= wanted
    seeks = [(sql, p) for sql, p in timed(seen) if "ORDER BY experiments.created_at" in sql]
    assert seeks and all("ix_experiments_created" in " ".join(plan(db, sql, p))
                         for sql, p in seeks)


def test_the_check_catches_a_scan(db: Path) -> None:
    """The checker itself fails on a query that has no index (so the test above can fail)."""
    with pytest.raises(AssertionError):
        check_plans(db, [("SELECT id FROM experiments WHERE description = ? "
                          "ORDER BY id DESC LIMIT 5", ("x",))])
    with pytest.raises(AssertionError):  # an IN list read in id order sorts every match
        check_plans(db, [("SELECT id FROM experiments WHERE status IN (?, ?) "
                          "ORDER BY id DESC LIMIT 5", ("kept", "crashed"))])


# --- PostgreSQL: the same requests, EXPLAIN ANALYZE on ANALYZE'd statistics -----------------
PG_ROWS = 20_000  # bulk rows on top of the workload: enough that a scan would cost the planner
PREPARED_RUNS = 6  # psycopg prepares on the 5th execution; the server may then keep one plan


def pg_plans(url: str, sql: str, params: Any) -> list[dict[str, Any]]:
    """EXPLAIN ANALYZE of the statement in a session set up like the engine's: planned for its
    values, and as a prepared statement after PREPARED_RUNS executions (the plan the server
    would cache and reuse for every value, unless the session plans each execution)."""
    import psycopg

    names: list[str] = []
    numbered = re.sub(r"%\((\w+)\)s", lambda m: f"${_number(names, m.group(1))}", sql)
    values = [params[n] for n in names]
    execute = f"EXECUTE page({', '.join(['%s'] * len(names))})" if names else "EXECUTE page"
    libpq = DbLocation.parse(url).pg_url.set(drivername="postgresql")  # type: ignore[union-attr]
    with psycopg.connect(libpq.render_as_string(hide_password=False), autocommit=True,
                         **postgres_connect_args()) as con:
        cur = psycopg.ClientCursor(con)
        cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params or None)
        plans = [cur.fetchone()[0][0]["Plan"]]  # type: ignore[index]
        cur.execute(f"PREPARE page AS {numbered}")
        for _ in range(PREPARED_RUNS):
            cur.execute(execute, values or None)
        cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {execute}", values or None)
        plans.append(cur.fetchone()[0][0]["Plan"])  # type: ignore[index]
    return plans


def _number(names: list[str], name: str) -> int:
    if name not in names:
        names.append(name)
    return names.index(name) + 1


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)


def check_pg_plans(url: str, statements: list[Statement], table_rows: int) -> int:
    """Assert no plan of a SELECT on experiments reads the whole table (a Seq Scan; or index
    entries and rows, filtered out or not, beyond a quarter of the table) or sorts more than a
    twentieth of it (the planner may read a small time window on its created_at index and put
    those rows in id order); returns how many statements were checked."""
    checked = 0
    for sql, params in statements:
        if not sql.lstrip().upper().startswith("SELECT") or "FROM experiments" not in sql:
            continue
        for top in pg_plans(url, sql, params):
            nodes = list(_nodes(top))
            detail = f"{sql}\n{params}\n{[n['Node Type'] for n in nodes]}\n{top}"
            assert not any(n["Node Type"] == "Seq Scan" for n in nodes), f"scan: {detail}"
            assert _read(nodes) <= table_rows // 4, f"read {_read(nodes)} rows: {detail}"
            for sort in (n for n in nodes if "Sort" in n["Node Type"]):
                ordered = sum(c["Actual Rows"] for c in sort.get("Plans", ()))
                assert ordered <= table_rows // 20, f"sorted {ordered} rows: {detail}"
        checked += 1
    return checked


def _read(nodes: list[dict[str, Any]]) -> int:
    """Rows and index entries the plan's scans of experiments touched (bitmap entries too)."""
    scans = [n for n in nodes if n.get("Relation Name") == "experiments" or
             n["Node Type"] == "Bitmap Index Scan"]
    return sum((n["Actual Rows"] + n.get("Rows Removed by Filter", 0) +
                n.get("Rows Removed by Index Recheck", 0)) * n["Actual Loops"] for n in scans)


@pytest.fixture(scope="module")
def pg_db(pg_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The workload of the SQLite test, then PG_ROWS bulk rows in sweep "a" (ANALYZE'd)."""
    url = pg_cluster.create_database("plans")
    engine = open_database(url)
    sweeps = _workload(SqlStore(engine), steps=300, seed=2)
    engine.dispose()
    # Created after the workload's rows (from a minute ahead, 5 minutes apart), so created_at
    # follows id as it does for rows the store writes (the time filter relies on that).
    seed(url, sweeps[0], PG_ROWS, start=utcnow() + timedelta(minutes=1))
    yield url
    pg_cluster.drop_database(url)


@pytest.mark.postgres
def test_every_api_list_query_uses_an_index_on_postgresql(
        pg_db: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    with TestClient(make_app(pg_db, work_dir=tmp_path_factory.mktemp("work"))) as c, \
            captured() as seen:
        wanted = send_list_requests(c)
    assert check_pg_plans(pg_db, seen, PG_ROWS) >= wanted


@pytest.mark.postgres
def test_every_time_filtered_list_query_uses_an_index_on_postgresql(
        pg_db: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    with TestClient(make_app(pg_db, work_dir=tmp_path_factory.mktemp("work"))) as c, \
            captured() as seen:
        wanted = send_time_filtered_requests(c)
    assert check_pg_plans(pg_db, timed(seen), PG_ROWS) >= wanted


@pytest.mark.postgres
def test_the_postgresql_check_catches_a_scan_a_walk_and_a_sort(pg_db: str) -> None:
    """The checker fails on a filter without an index (the whole table read), on a filter the
    planner cannot see through (the primary key walked, row by row) and on a sort."""
    with pytest.raises(AssertionError, match="^(scan|read)"):
        check_pg_plans(pg_db, [("SELECT id FROM experiments WHERE description = %(d)s "
                                "ORDER BY id DESC LIMIT %(n)s", {"d": "x", "n": 5})], PG_ROWS)
    with pytest.raises(AssertionError, match="^read"):
        check_pg_plans(pg_db, [("SELECT id FROM experiments WHERE id + 0 > %(a)s "
                                "ORDER BY id DESC LIMIT %(n)s", {"a": 10**9, "n": 5})], PG_ROWS)
    with pytest.raises(AssertionError, match="^sorted"):  # the crashed rows, ordered by metric
        check_pg_plans(pg_db, [("SELECT id FROM experiments WHERE status = %(s)s "
                                "ORDER BY metric LIMIT %(n)s", {"s": "crashed", "n": 5})],
                       PG_ROWS)
