"""The real server in a subprocess (`overnight serve`, ephemeral loopback port, httpx):
experiments to completion, the single-instance lock, 200 concurrent POSTs, kill -9 recovery."""

from __future__ import annotations

import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from service_fixtures import (
    AUTH,
    ServerProcess,
    branch_head,
    check_invariants,
    kill9_scenario,
    knob_diff,
    make_counting_target,
    wait_for,
)


def test_serve_runs_a_sweep_to_completion_and_refuses_a_second_instance(tmp_path: Path) -> None:
    target = make_counting_target(tmp_path / "target", n_knobs=4)
    server = ServerProcess(tmp_path / "o.db", log=tmp_path / "server.log").start()
    try:
        with server.client() as c:
            r = c.post("/sweeps", json={"name": "night", "target": str(target), "budget_s": 1,
                                        "max_experiments": 3, "proposer": "knobs"})
            assert r.status_code == 201, r.text
            r = c.post("/experiments", json={"sweep": "night", "description": "K0 = 1",
                                              "diff": knob_diff(target, 0, 1), "priority": 9})
            assert r.status_code == 201, r.text
            assert httpx.get(f"{server.url}/sweeps").status_code == 401  # loopback too
            assert c.get("/sweeps").status_code == 200  # with the token
            assert httpx.post(f"{server.url}/sweeps/night/pause").status_code == 401

            twin = ServerProcess(tmp_path / "o.db", log=tmp_path / "2.log")
            second = subprocess.run(twin.argv, env=twin.env, capture_output=True, text=True,
                                    timeout=60)
            assert second.returncode == 2
            assert "already using this database" in second.stdout + second.stderr

            wait_for(lambda: c.get("/sweeps/night").json()["status"] == "done", 60,
                     "the sweep to finish")
            exps = c.get("/experiments", params={"sweep": "night"}).json()
            sweep = c.get("/sweeps/night").json()
            health = c.get("/health").json()
        assert exps["count"] == 4
        statuses = [e["status"] for e in exps["data"]]
        assert set(statuses) <= {"kept", "discarded"} and statuses[-1] == "kept"  # baseline
        queued = next(e for e in exps["data"] if e["description"] == "K0 = 1")
        assert queued["status"] == "kept" and queued["delta"] < 0
        assert branch_head(target, "overnight/night") == sweep["best_commit"]
        assert health["scheduler"] == "running" and health["queue_depth"] == 0
    finally:
        code = server.stop()  # checked after the body's own assertions, never instead of them
    # uvicorn re-raises the SIGTERM after its graceful shutdown
    assert code in (0, -signal.SIGTERM), server.tail()
    assert "Traceback" not in server.tail(100_000), server.tail()


def test_a_target_gone_after_a_restart_pauses_its_sweep(tmp_path: Path) -> None:
    """Resumed after a restart with its target directory moved away, a sweep is paused with the
    problem in the log; its baseline stays queued (it used to be claimed and left `running`).
    With the directory back, a resume runs it."""
    target = make_counting_target(tmp_path / "target", n_knobs=2)
    server = ServerProcess(tmp_path / "o.db", log=tmp_path / "server.log").start()
    try:
        with server.client() as c:
            r = c.post("/sweeps", json={"name": "gone", "target": str(target),
                                        "proposer": "queue", "paused": True})
            assert r.status_code == 201, r.text
        server.stop()
        moved = target.rename(tmp_path / "moved")
        server.start()  # a fresh process: no repository adapter cached
        with server.client() as c:
            assert c.post("/sweeps/gone/resume").status_code == 200
            wait_for(lambda: c.get("/sweeps/gone").json()["status"] == "paused", 30,
                     "the sweep to be paused")
            assert c.get("/experiments/1").json()["status"] == "queued"
            assert c.get("/health").json()["scheduler"] == "running"
            moved.rename(target)
            assert c.post("/sweeps/gone/resume").status_code == 200
            wait_for(lambda: c.get("/experiments/1").json()["status"] == "kept", 60,
                     "the baseline to run once the target is back")
    finally:
        code = server.stop()
    assert code in (0, -signal.SIGTERM), server.tail()
    assert "sweep gone paused: cannot set up its runs" in server.tail(100_000), server.tail()
    assert str(target) in server.tail(100_000)


def test_200_concurrent_posts_are_all_recorded(tmp_path: Path) -> None:
    target = make_counting_target(tmp_path / "target", n_knobs=200)
    server = ServerProcess(tmp_path / "o.db", log=tmp_path / "server.log").start()
    try:
        with server.client() as c:
            r = c.post("/sweeps", json={"name": "busy", "target": str(target), "paused": True,
                                        "proposer": "queue"})
            assert r.status_code == 201, r.text
        diffs = [knob_diff(target, k, 1) for k in range(200)]
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=120, limits=limits) as c:
            def post(k: int) -> httpx.Response:
                return c.post("/experiments", json={"sweep": "busy", "description": f"K{k}",
                                                     "diff": diffs[k]})

            with ThreadPoolExecutor(max_workers=50) as pool:
                responses = list(pool.map(post, range(200)))
            bad = [(r.status_code, r.text[:200]) for r in responses if r.status_code != 201]
            assert not bad, bad[:3]
            ids = {r.json()["id"] for r in responses}
            assert len(ids) == 200
            listed = c.get("/experiments", params={"sweep": "busy", "status": "queued"}).json()
            assert listed["count"] == 201  # + the baseline
    finally:
        server.stop()
    assert "database is locked" not in server.tail(1_000_000)


def test_kill9_mid_run_loses_nothing_and_runs_nothing_twice(tmp_path: Path) -> None:
    result = kill9_scenario(tmp_path, kills=2, experiments=5, sleep_s=1.0, seed=1)
    assert result["problems"] == [], result
    assert result["kills"] == 2 and len(result["interrupted"]) >= 1, result
    assert all(i in result["retries"] for i in result["interrupted"]), result  # each followed up
    assert result["branch_ok"] and result["statuses"].get("queued", 0) == 0


def test_the_kill9_invariants_check_can_fail() -> None:
    """The scenario's judge flags each kind of damage (so a clean verdict means something)."""
    exps = [{"id": 1, "status": "kept", "metric": 1.3, "meta": {}},
            {"id": 2, "status": "interrupted", "metric": None, "meta": {}},
            {"id": 3, "status": "discarded", "metric": 1.4, "meta": {"retry_of": 2}}]
    one = [(1, 42), (2, 42), (3, 42)]  # (experiment, seed) of each run start
    rec = {1: 1, 3: 1}  # run records per experiment
    assert check_invariants(exps, one, {1: ("kept", 1.3)}, "abc", "abc", rec) == []
    changed = check_invariants(exps, one, {3: ("kept", 1.2)}, "abc", "abc", rec)
    assert changed == ["finished result 3 changed: ('kept', 1.2) -> ('discarded', 1.4)"]
    assert "experiment 3 ran seed 42 2 times" in check_invariants(
        exps, [*one, (3, 42)], {}, "abc", "abc", rec)
    assert "finished experiment 3 ran 2 times, 1 run records" in check_invariants(
        exps, [*one, (3, 43)], {}, "abc", "abc", rec)  # a run the database does not know
    # an incumbent re-run of 3 cut off by a kill: a start the database knows as cut off
    assert check_invariants(exps, [*one, (3, 43)], {}, "abc", "abc", rec, {1: 1, 3: 2}) == []
    assert "finished experiment 3 ran 3 times, 1 run records (2 with those cut off)" in \
        check_invariants(exps, [*one, (3, 43), (3, 44)], {}, "abc", "abc", rec, {1: 1, 3: 2})
    assert check_invariants(exps, one, {}, "abc", "def", rec) == [
        "branch at abc but the DB best is def"]
    lost = check_invariants(exps[:2], one[:2], {}, "abc", "abc", rec)
    assert lost == ["interrupted experiment 2 was not followed up"]
    gone = check_invariants(exps[:1], one[:1], {2: ("discarded", 1.4)}, "abc", "abc", rec)
    assert gone == ["finished result 2 changed: ('discarded', 1.4) -> None"]


def test_a_given_up_change_is_judged_by_its_chain() -> None:
    """A change recovery gave up ("took the service down") is a verdict row that never ran: fine
    when more than MAX_CRASH_RETRIES rows before it had a run cut off, a problem otherwise or
    when the verdict row itself ran."""
    from agent.rules.endings import GAVE_UP_CAUSE, MAX_CRASH_RETRIES

    n = MAX_CRASH_RETRIES + 1
    chain = [{"id": i, "status": "interrupted", "metric": None,
              "meta": {"retry_of": i - 1} if i > 1 else {}} for i in range(1, n + 1)]
    verdict = {"id": n + 1, "status": "crashed", "metric": None,
               "meta": {"retry_of": n, "verdict": {"ending": "gave up"}},
               "reason": f"{GAVE_UP_CAUSE}: its run was cut off each of the {n} times"}
    exps = [*chain, verdict]
    runs = [(i, 42) for i in range(1, n + 1)]
    cut = {i: 1 for i in range(1, n + 1)}  # each row of the chain: one run record, cut off
    assert check_invariants(exps, runs, {}, "abc", "abc", {}, cut) == []
    assert check_invariants(exps, runs, {}, "abc", "abc", {}, {**cut, 1: 0}) == [
        f"experiment {n + 1} given up after {n - 1} cut-off runs of its chain"]
    assert check_invariants(exps, [*runs, (n + 1, 42)], {}, "abc", "abc", {}, cut) == [
        f"given-up verdict {n + 1} ran itself"]
