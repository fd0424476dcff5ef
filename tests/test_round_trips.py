"""What one request costs the database, counted (issue 14 parts 2 and 5), on SQLite and
PostgreSQL, through the real server over loopback: a list request reads on one connection in
one transaction (one pool checkout: one pre-ping on PostgreSQL, one BEGIN, one COMMIT), and a
POST /experiments sends a fixed, small number of statements. Counts of statements and
checkouts, never timings: the engine's own event hooks record them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_helpers import serve
from service_fixtures import AUTH, TOKEN, knob_diff, make_counting_target
from sqlalchemy import Engine, event

from api.main import create_app
from api.settings import Settings
from overnight.runtime import Runtime


class Trips:
    """The engine's checkouts, statements, BEGINs and COMMITs while it is watched."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.seen: Counter[str] = Counter()
        self.statements: list[str] = []

    def _statement(self, _c: Any, _cur: Any, statement: str, *_rest: Any) -> None:
        self.statements.append(statement.split(None, 1)[0].upper())

    def _hooks(self) -> list[tuple[Any, str, Any]]:
        def bump(name: str) -> Any:
            return lambda *_a: self.seen.update([name])
        return [(self.engine, "before_cursor_execute", self._statement),
                (self.engine.pool, "checkout", bump("checkout")),
                (self.engine, "begin", bump("begin")),
                (self.engine, "commit", bump("commit")),
                (self.engine, "rollback", bump("rollback"))]

    @contextmanager
    def watch(self) -> Iterator[Trips]:
        self.seen.clear()
        self.statements.clear()
        hooks = self._hooks()
        for target, name, fn in hooks:
            event.listen(target, name, fn)
        try:
            yield self
        finally:
            for target, name, fn in hooks:
                event.remove(target, name, fn)


@pytest.fixture(params=["sqlite", "postgres"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[httpx.Client,
                                                                               Trips, Path]]:
    db: str | Path = (tmp_path / "o.db" if request.param == "sqlite"
                      else request.getfixturevalue("pg_url"))
    target = make_counting_target(tmp_path / "target", n_knobs=6)
    runtime = Runtime(db, work_dir=tmp_path / "work")
    settings = Settings.build(db_path=db, work_dir=tmp_path / "work", token=TOKEN,
                              run_scheduler=False)
    app = create_app(settings, runtime)
    try:
        with serve(app) as url, httpx.Client(base_url=url, headers=AUTH, timeout=60) as c:
            r = c.post("/sweeps", json={"name": "rt", "target": str(target), "paused": True,
                                        "proposer": "queue"})
            assert r.status_code == 201, r.text
            yield c, Trips(runtime.store.engine), target
    finally:
        runtime.close()


def _post(c: httpx.Client, target: Path, knob: int) -> httpx.Response:
    return c.post("/experiments", json={"sweep": "rt", "description": f"K{knob} = 1",
                                        "diff": knob_diff(target, knob, 1)})


@pytest.mark.parametrize(("params", "pages"), [
    ({}, 1), ({"sweep": "rt", "status": "queued"}, 1),
    ({"sweep": "rt", "status": ["queued", "running"], "limit": 1}, 2)])  # a range per status
def test_a_list_request_reads_in_one_transaction(served, params: dict[str, Any],  # type: ignore[no-untyped-def]
                                                 pages: int) -> None:
    c, trips, target = served
    for knob in range(3):
        assert _post(c, target, knob).status_code == 201
    with trips.watch():
        r = c.get("/experiments", params=params)
    assert r.status_code == 200, r.text
    assert r.json()["count"] == 4  # the three and the sweep's baseline (queued: paused)
    assert {e["sweep"] for e in r.json()["data"]} == {"rt"}
    # The sweep (by name, or the names of the page's sweeps), the page, its count: on one
    # connection.
    assert trips.statements == ["SELECT"] * (2 + pages), trips.statements
    assert trips.seen == {"checkout": 1, "begin": 1, "commit": 1}, trips.seen


def test_reading_an_experiment_is_one_transaction(served) -> None:  # type: ignore[no-untyped-def]
    c, trips, target = served
    exp = _post(c, target, 0).json()
    with trips.watch():
        r = c.get(f"/experiments/{exp['id']}")
    assert r.status_code == 200 and r.json()["diff"] and r.json()["run_records"] is not None
    # The experiment, its sweep's name and its runs (one statement each, never one per run): on
    # one connection, in one transaction.
    assert trips.statements == ["SELECT", "SELECT", "SELECT"], trips.statements
    assert trips.seen == {"checkout": 1, "begin": 1, "commit": 1}, trips.seen


@pytest.mark.parametrize("path", ["/sweeps", "/sweeps/rt"])
def test_reading_sweeps_is_one_transaction(served, path: str) -> None:  # type: ignore[no-untyped-def]
    c, trips, _target = served
    with trips.watch():
        r = c.get(path)
    assert r.status_code == 200, r.text
    assert trips.statements == ["SELECT", "SELECT"], trips.statements  # the sweeps, the counts
    assert trips.seen == {"checkout": 1, "begin": 1, "commit": 1}, trips.seen


def test_a_post_sends_a_few_statements(served) -> None:  # type: ignore[no-untyped-def]
    c, trips, target = served
    with trips.watch():
        r = _post(c, target, 1)
    assert r.status_code == 201, r.text
    # The sweep and the duplicate lookup in one read transaction; then the sweep's check,
    # the INSERT and the counts' upsert in the write transaction.
    assert trips.statements == ["SELECT", "SELECT", "SELECT", "INSERT", "INSERT"], \
        trips.statements
    assert trips.seen == {"checkout": 2, "begin": 2, "commit": 2}, trips.seen


def test_a_refused_post_writes_nothing(served) -> None:  # type: ignore[no-untyped-def]
    c, trips, target = served
    assert _post(c, target, 2).status_code == 201
    with trips.watch():
        again = _post(c, target, 2)  # the same change: refused before git
        bad = c.post("/experiments", json={"sweep": "rt", "description": "x",
                                           "diff": "--- a/nope.py\n+++ b/nope.py\n"})
    assert again.status_code == 422 and "already tried" in again.text, again.text
    assert bad.status_code == 422, bad.text
    assert "INSERT" not in trips.statements and "UPDATE" not in trips.statements
