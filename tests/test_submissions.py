"""POST /experiments at agent speed, correct under concurrency (issue 14 part 2), on the real
server over loopback: distinct proposals to two sweeps land exactly once, identical ones once,
bad diffs keep their clear errors, and slow admissions block neither the event loop nor
another sweep. The duplicate check reads one index, whatever the sweep's size."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_probes import post_burst
from browser_helpers import serve
from service_fixtures import AUTH, TOKEN, ServerProcess, knob_diff, make_counting_target, wait_for
from sqlalchemy import event

from agent.core.diff import PathChange
from agent.git.repo import GitRepo
from agent.ops.sweeps import create_sweep
from api.deps import ADMISSIONS_PER_SWEEP
from api.main import create_app
from api.settings import Settings
from overnight.runtime import Runtime

N_PER_SWEEP = 40


def _sweep(client: httpx.Client, name: str, target: Path) -> None:
    r = client.post("/sweeps", json={"name": name, "target": str(target), "paused": True,
                                     "proposer": "queue"})
    assert r.status_code == 201, r.text


def _queued(client: httpx.Client, sweep: str) -> list[dict[str, Any]]:
    page = client.get("/experiments", params={"sweep": sweep, "status": "queued",
                                              "limit": 200}).json()
    return [e for e in page["data"] if e["description"] != "baseline"]


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    srv = ServerProcess(tmp_path / "o.db", log=tmp_path / "server.log", slots=0).start()
    yield srv
    srv.stop()


def test_distinct_posts_to_two_sweeps_land_exactly_once(server, tmp_path: Path) -> None:
    targets = {n: make_counting_target(tmp_path / n, n_knobs=N_PER_SWEEP) for n in ("a", "b")}
    with server.client() as c:
        for name, target in targets.items():
            _sweep(c, name, target)
    bodies = [{"sweep": name, "description": f"{name} K{k} = 1",
               "diff": knob_diff(target, k, 1)}
              for k in range(N_PER_SWEEP) for name, target in targets.items()]
    burst = post_burst(server.url, bodies, workers=len(bodies))
    assert burst["statuses"] == {201: len(bodies)} and burst["errors"] == 0
    assert len(set(burst["ids"])) == len(bodies)
    with server.client() as c:
        for name in targets:
            rows = _queued(c, name)
            assert Counter(e["description"] for e in rows) == Counter(
                f"{name} K{k} = 1" for k in range(N_PER_SWEEP))
    assert "Traceback" not in server.tail(1_000_000)


def test_identical_and_bad_posts_in_one_burst(server, tmp_path: Path) -> None:
    """Twenty copies of one change land once (422 duplicate for the rest); a diff that does
    not apply gets 409 with git's words; a change git alone sees (an empty new file) gets 422
    naming the file. None of the refused ones is queued."""
    target = make_counting_target(tmp_path / "t", n_knobs=4)
    with server.client() as c:
        _sweep(c, "s", target)
    same = {"sweep": "s", "description": "K0 = 7", "diff": knob_diff(target, 0, 7)}
    stale = knob_diff(target, 1, 1).replace("K1 = 0", "K1 = 5", 1)  # context not in the file
    sneaky = knob_diff(target, 2, 1) + ("diff --git a/evil.py b/evil.py\nnew file mode 100644\n"
                                        "index 0000000..e69de29\n")
    bad = [{"sweep": "s", "description": "stale", "diff": stale},
           {"sweep": "s", "description": "sneaky", "diff": sneaky}]
    burst = post_burst(server.url, [same] * 20 + bad * 5, workers=30)
    assert burst["statuses"] == {201: 1, 422: 19 + 5, 409: 5}
    with server.client() as c:
        assert [e["description"] for e in _queued(c, "s")] == ["K0 = 7"]
        r = c.post("/experiments", json=bad[0])
        assert r.status_code == 409 and r.json()["detail"]["code"] == "does_not_apply"
        assert "train.py" in r.json()["detail"]["message"]
        r = c.post("/experiments", json=bad[1])
        assert r.status_code == 422 and r.json()["detail"]["code"] == "not_editable"
        assert "evil.py" in r.json()["detail"]["message"]
        r = c.post("/experiments", json=same)
        assert r.status_code == 422 and r.json()["detail"]["code"] == "duplicate"


class GatedRepo(GitRepo):
    """The real repository, whose admissions wait at a gate: a slow git, on demand."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.waiting = 0
        self._lock = threading.Lock()

    def tree_changes(self, base: str, diff: str) -> list[PathChange]:
        with self._lock:
            self.waiting += 1
        try:
            self.gate.wait(120)  # only bounds a hang; the test opens it
        finally:
            with self._lock:
                self.waiting -= 1
        return super().tree_changes(base, diff)


class GatedRuntime(Runtime):
    """The real runtime, handing out the gated repository for its target."""

    def __init__(self, db: Path, gated: GatedRepo) -> None:
        super().__init__(db)
        self.gated = gated

    def repo_at(self, path: Path | str) -> GitRepo:
        if Path(path).resolve() == self.gated.path.resolve():
            return self.gated
        return super().repo_at(path)


def test_slow_admissions_block_neither_the_event_loop_nor_another_sweep(tmp_path: Path) -> None:
    slow_target = make_counting_target(tmp_path / "slow", n_knobs=50)
    fast_target = make_counting_target(tmp_path / "fast", n_knobs=2)
    gated = GatedRepo(slow_target)
    runtime = GatedRuntime(tmp_path / "o.db", gated)
    settings = Settings.build(db_path=tmp_path / "o.db", token=TOKEN, run_scheduler=False)
    app = create_app(settings, runtime)
    with serve(app) as url, httpx.Client(base_url=url, headers=AUTH, timeout=300,
                                         limits=httpx.Limits(max_connections=60)) as c:
        _sweep(c, "slow", slow_target)
        _sweep(c, "fast", fast_target)
        bodies = [{"sweep": "slow", "description": f"K{k} = 1",
                   "diff": knob_diff(slow_target, k, 1)} for k in range(50)]
        with ThreadPoolExecutor(50) as pool:
            posts = [pool.submit(c.post, "/experiments", json=b) for b in bodies]
            try:
                wait_for(lambda: gated.waiting == ADMISSIONS_PER_SWEEP, 60,
                         "the slow sweep's admissions to reach the gate")
                # The event loop answers, and so do the plain `def` routes' worker threads.
                assert c.get("/health").status_code == 200
                assert c.get("/experiments", params={"limit": 5}).status_code == 200
                # Another sweep's proposal is admitted while the slow ones still wait.
                r = c.post("/experiments", json={"sweep": "fast", "description": "K0 = 1",
                                                 "diff": knob_diff(fast_target, 0, 1)})
                assert r.status_code == 201, r.text
                assert gated.waiting == ADMISSIONS_PER_SWEEP
                assert not any(p.done() for p in posts)  # none got past the gate, none failed
            finally:
                gated.gate.set()
            codes = Counter(p.result().status_code for p in posts)
        assert codes == {201: 50}
        assert len(_queued(c, "slow")) == 50


def test_the_duplicate_check_searches_one_index(store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    target = make_counting_target(tmp_path / "t", n_knobs=2)
    """`has_diff` runs on every proposal: on SQLite the plan of the very statement it sends is
    an index search on (sweep_id, diff_key), never a walk of the sweep's rows."""
    sweep = create_sweep(store, GitRepo(target), target, name="plan")
    sent: list[tuple[str, Any]] = []

    def record(_conn, _cursor, statement, params, _context, _many):  # type: ignore[no-untyped-def]
        sent.append((statement, params))

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        assert store.has_diff(sweep.id, knob_diff(target, 0, 1)) is None
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    (statement, params), = [q for q in sent if "diff_key" in q[0]]
    with store.engine.connect() as conn:
        plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params).fetchall()
    details = " ".join(str(row[-1]) for row in plan)
    assert "ix_experiments_sweep_diff (sweep_id=? AND diff_key=?)" in details, details
