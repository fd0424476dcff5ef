"""REST routes through TestClient: contracts, every bad-input class, auth on/off, SSE log."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import make_target
from fastapi.testclient import TestClient
from service_fixtures import AUTH, TOKEN, knob_diff, make_counting_target, wait_for
from sqlalchemy import update

from agent.core.domain import ExperimentStatus, Finish
from agent.core.errors import ConfigError
from api.settings import Settings, ensure_token
from db.models import ExperimentRow
from overnight.runtime import service_app


def _client(tmp_path: Path, *, signed_in: bool = True, **overrides: object) -> TestClient:
    """The app in a TestClient; `signed_in`: it sends the token with every request (as the
    owner's clients do), else only where a test adds it."""
    values: dict[str, object] = {"db_path": tmp_path / "db" / "o.db", "token": TOKEN,
                                 "run_scheduler": False, "allowed_hosts": ("testserver",)}
    values.update(overrides)
    return TestClient(service_app(Settings.build(**values)), headers=AUTH if signed_in else None)


@pytest.fixture
def target(tmp_path: Path) -> Path:
    return make_counting_target(tmp_path / "target", n_knobs=20)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with _client(tmp_path) as c:
        yield c


def _sweep(client: TestClient, target: Path, name: str = "s1", **extra: object) -> dict:
    r = client.post("/sweeps", json={"name": name, "target": str(target), "budget_s": 1,
                                     "proposer": "queue", **extra}, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()


def _queue(client: TestClient, target: Path, knob: int, value: int = 1, sweep: str = "s1"):
    return client.post("/experiments", headers=AUTH, json={
        "sweep": sweep, "description": f"K{knob} = {value}",
        "diff": knob_diff(target, knob, value)})


def _code(r) -> str:  # type: ignore[no-untyped-def]
    return r.json()["detail"]["code"]


def test_sweep_and_experiment_round_trip(client: TestClient, target: Path) -> None:
    sweep = _sweep(client, target, window={"start": "22:00", "stop": "07:00"},
                   max_experiments=5)
    assert sweep["branch"] == "overnight/s1" and sweep["counts"] == {"queued": 1}
    assert sweep["window"] == {"start": "22:00", "stop": "07:00"}
    r = _queue(client, target, 3)
    assert r.status_code == 201, r.text
    exp = r.json()
    assert exp["status"] == "queued" and exp["sweep"] == "s1" and exp["diff"] is None
    assert {"id", "crash_kind", "metric", "delta", "best_before", "commit", "ref", "parent_id",
            "attempt", "proposer", "reason", "summary", "created_at", "started_at",
            "finished_at", "log_path"} <= set(exp)
    one = client.get(f"/experiments/{exp['id']}").json()
    assert one["diff"].startswith("--- a/train.py")
    assert client.get(f"/experiments/{exp['id']}/diff").text == one["diff"]
    assert [s["name"] for s in client.get("/sweeps").json()["data"]] == ["s1"]
    assert client.get("/sweeps/s1").json()["counts"] == {"queued": 2}


def test_list_filters_and_cursor_pagination(client: TestClient, target: Path) -> None:
    _sweep(client, target)
    ids = [_queue(client, target, k).json()["id"] for k in range(7)]
    page = client.get("/experiments", params={"sweep": "s1", "limit": 3}).json()
    assert page["count"] == 8 and [e["id"] for e in page["data"]] == ids[::-1][:3]
    assert all(e["diff"] is None for e in page["data"])
    seen = [e["id"] for e in page["data"]]
    while page["next_cursor"]:
        page = client.get("/experiments", params={"sweep": "s1", "limit": 3,
                                                  "cursor": page["next_cursor"]}).json()
        seen += [e["id"] for e in page["data"]]
    assert seen == sorted(ids + [1], reverse=True)
    services = client.app.state.services  # type: ignore[attr-defined]
    services.store.claim(ids[0])
    services.store.finish(ids[0], Finish(ExperimentStatus.CRASHED, crash_kind=None))
    crashed = client.get("/experiments", params=[("status", "crashed"), ("status", "kept")])
    assert [e["id"] for e in crashed.json()["data"]] == [ids[0]]
    assert client.get("/experiments", params={"crash_kind": "trivial"}).json()["count"] == 0
    assert client.get("/experiments", params={"status": "bogus"}).status_code == 422
    assert client.get("/experiments", params={"limit": 0}).status_code == 422


def test_an_unfiltered_list_names_each_rows_sweep(client: TestClient, target: Path) -> None:
    """Without `sweep`, the page's rows come from several sweeps; each names its own (the
    names of the page's sweeps are read, not every sweep's)."""
    for name in ("s1", "s2", "s3"):
        _sweep(client, target, name)
    for knob, name in ((1, "s1"), (2, "s3"), (3, "s1")):
        assert _queue(client, target, knob, sweep=name).status_code == 201
    rows = client.get("/experiments", params={"limit": 5}).json()["data"]
    assert [e["sweep"] for e in rows] == ["s1", "s3", "s1", "s3", "s2"]
    queued = client.get("/experiments", params={"status": "queued", "limit": 2}).json()
    assert [e["sweep"] for e in queued["data"]] == ["s1", "s3"] and queued["count"] == 6


def test_list_time_window_in_any_offset_walks_with_the_cursor(client: TestClient,
                                                               target: Path) -> None:
    """since/until on created_at, [since, until), in UTC, an offset or naive (read as UTC);
    the cursor keeps the window; `count` is null with a window; a bad value is a 422 that
    names the parameter."""
    _sweep(client, target)
    ids = [1] + [_queue(client, target, k).json()["id"] for k in range(9)]
    night = datetime(2026, 11, 29, 22, 0, tzinfo=UTC)
    engine = client.app.state.services.store.engine  # type: ignore[attr-defined]
    with engine.begin() as conn:
        for n, i in enumerate(ids):  # one an hour from 22:00
            conn.execute(update(ExperimentRow).where(ExperimentRow.id == i)
                         .values(created_at=night + timedelta(hours=n)))
    windows = {("2026-11-30T00:00:00Z", "2026-11-30T05:00:00Z"): ids[2:7],
               ("2026-11-30T02:00:00+02:00", None): ids[2:],
               ("2026-11-30T01:30", "2026-11-30T03:00:00.000001"): ids[4:6],
               (None, "2026-11-30"): ids[:2]}
    for (since, until), want in windows.items():
        params = {k: v for k, v in {"since": since, "until": until}.items() if v}
        page = client.get("/experiments", params={**params, "limit": 2}).json()
        assert page["count"] is None
        seen = [e["id"] for e in page["data"]]
        while page["next_cursor"]:
            page = client.get("/experiments", params={**params, "limit": 2,
                                                      "cursor": page["next_cursor"]}).json()
            seen += [e["id"] for e in page["data"]]
        assert seen == want[::-1], (since, until)
    both = client.get("/experiments", params={"since": "2026-11-30T00:00:00Z", "sweep": "s1",
                                              "status": "queued"}).json()
    assert [e["id"] for e in both["data"]] == ids[2:][::-1]
    for bad, name in [({"since": "last night"}, "since"), ({"until": "2026-13-01"}, "until"),
                      ({"since": "1764460800"}, "since"), ({"until": "0.5"}, "until"),
                      ({"since": "2026-11-30", "until": "2026-11-30"}, "until"),
                      ({"since": "2026-11-30T05:00Z", "until": "2026-11-30T01:00Z"}, "until")]:
        r = client.get("/experiments", params=bad)
        assert r.status_code == 422 and _code(r) == "validation", r.text
        assert r.json()["detail"]["message"].startswith(f"query.{name}:"), r.text


@pytest.mark.parametrize("case,status,code", [
    ("malformed_json", 422, "malformed_json"),
    ("missing_field", 422, "validation"),
    ("extra_field", 422, "validation"),
    ("unknown_sweep", 404, "not_found"),
    ("does_not_apply", 409, "does_not_apply"),
    ("protected", 422, "protected_file"),
    ("not_editable", 422, "not_editable"),
    ("absolute", 422, "path_escapes"),
    ("dotdot", 422, "path_escapes"),
    ("symlink", 422, "symlink"),
    ("binary", 422, "binary"),
    ("too_large", 413, "too_large"),
    ("empty_diff", 422, "validation"),
    ("duplicate", 422, "duplicate"),
])
def test_bad_experiment_input_is_refused_and_queues_nothing(
        client: TestClient, target: Path, case: str, status: int, code: str) -> None:
    _sweep(client, target)
    good = knob_diff(target, 1, 1)
    if case == "duplicate":
        assert _queue(client, target, 1).status_code == 201
    before = client.get("/experiments").json()["count"]
    body: object = {"sweep": "s1", "description": "x", "diff": good}
    bodies = {
        "missing_field": {"sweep": "s1", "diff": good},
        "extra_field": {**body, "shell": "rm -rf /"},  # type: ignore[dict-item]
        "unknown_sweep": {**body, "sweep": "nope"},  # type: ignore[dict-item]
        "does_not_apply": {**body, "diff": good.replace("-K1 = 0", "-K1 = 7")},  # type: ignore
        "protected": {**body, "diff": good.replace("train.py", "prepare.py")},  # type: ignore
        "not_editable": {**body, "diff": good.replace("train.py", "other.py")},  # type: ignore
        "absolute": {**body, "diff": good.replace("a/train.py", "/etc/passwd")},  # type: ignore
        "dotdot": {**body, "diff": good.replace("train.py", "../train.py")},  # type: ignore
        "symlink": {**body, "diff": "diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n"
                    "+++ b/l\n@@ -0,0 +1 @@\n+/etc/passwd\n"},
        "binary": {**body, "diff": "diff --git a/train.py b/train.py\nGIT binary patch\n"
                   "literal 1\nIcmZ?wKn(yK\n"},
        "too_large": {**body, "diff": good + "#" * (1024 * 1024)},  # type: ignore[dict-item]
        "empty_diff": {**body, "diff": ""},  # type: ignore[dict-item]
        "duplicate": body,
    }
    if case == "malformed_json":
        r = client.post("/experiments", content=b'{"sweep": "s1", ', headers={
            **AUTH, "content-type": "application/json"})
    else:
        r = client.post("/experiments", json=bodies[case], headers=AUTH)
    assert r.status_code == status, r.text
    assert _code(r) == code and r.json()["detail"]["message"]
    assert client.get("/experiments").json()["count"] == before


def test_does_not_apply_names_the_failing_file(client: TestClient, target: Path) -> None:
    _sweep(client, target)
    bad = knob_diff(target, 1, 1).replace("-K1 = 0", "-K1 = 7")
    r = client.post("/experiments", json={"sweep": "s1", "description": "x", "diff": bad},
                    headers=AUTH)
    assert r.status_code == 409 and "train.py" in r.json()["detail"]["message"]


@pytest.mark.parametrize("body,status", [
    ({"name": "bad name"}, 422), ({"name": "../x"}, 422), ({"name": "x.lock"}, 422),
    ({"name": "ok", "target": "/nonexistent"}, 422), ({"name": "ok", "budget_s": -1}, 422),
    ({"name": "ok", "window": {"start": "25:00", "stop": "07:00"}}, 422),
    ({"name": "ok", "proposer": "magic"}, 422),
    ({"name": "ok", "deadline": "2030-01-01T00:00:00"}, 422),  # naive: ambiguous
    ({"name": "ok", "budget": "600 parsecs"}, 422), ({"name": "ok", "budget": "0.5 steps"}, 422),
    ({"name": "ok", "budget": "2 days"}, 422),
    ({"name": "ok", "budget": "600 steps", "budget_s": 300}, 422),  # one budget, not two
])
def test_bad_sweep_input(client: TestClient, target: Path, body: dict, status: int) -> None:
    r = client.post("/sweeps", json={"target": str(target), **body}, headers=AUTH)
    assert r.status_code == status, r.text
    assert r.json()["detail"]["message"]
    assert client.get("/sweeps").json()["count"] == 0


def test_a_sweep_takes_a_compute_budget_as_the_cli_does(client: TestClient,
                                                        target: Path) -> None:
    r = client.post("/sweeps", json={"name": "steps", "target": str(target), "budget": "5 steps",
                                     "proposer": "queue"}, headers=AUTH)
    assert r.status_code == 201, r.text
    assert (r.json()["budget"], r.json()["budget_s"]) == ("5 steps", None)
    timed = _sweep(client, target, name="timed", budget_s=None, budget="3 s")
    assert (timed["budget"], timed["budget_s"]) == ("3 s", 3.0)
    bad = client.post("/sweeps", json={"name": "x", "target": str(target), "budget": "5 miles"},
                      headers=AUTH)
    assert bad.status_code == 422 and "budget" in bad.json()["detail"]["message"]


def test_duplicate_sweep_name_conflicts(client: TestClient, target: Path) -> None:
    _sweep(client, target)
    r = client.post("/sweeps", json={"name": "s1", "target": str(target)}, headers=AUTH)
    assert r.status_code == 409 and _code(r) == "conflict"


def test_unknown_ids_are_404(client: TestClient) -> None:
    for path in ("/sweeps/nope", "/sweeps/nope/best", "/sweeps/nope/results.tsv",
                 "/experiments/999", "/experiments/999/diff", "/experiments/999/log"):
        r = client.get(path)
        assert r.status_code == 404 and _code(r) == "not_found", path
    assert client.post("/sweeps/nope/pause", headers=AUTH).status_code == 404
    assert client.delete("/experiments/999", headers=AUTH).status_code == 404


def test_cancel_queued_then_finished_is_read_only(client: TestClient, target: Path) -> None:
    _sweep(client, target)
    exp_id = _queue(client, target, 2).json()["id"]
    r = client.delete(f"/experiments/{exp_id}", headers=AUTH)
    assert r.status_code == 200 and r.json()["experiment"]["status"] == "cancelled"
    r = client.delete(f"/experiments/{exp_id}", headers=AUTH)
    assert r.status_code == 409 and "cancelled" in r.json()["detail"]["message"]


def test_pause_resume_stop(client: TestClient, target: Path) -> None:
    _sweep(client, target)
    assert client.post("/sweeps/s1/pause", headers=AUTH).json()["status"] == "paused"
    assert client.post("/sweeps/s1/resume", headers=AUTH).json()["status"] == "running"
    assert client.post("/sweeps/s1/stop", headers=AUTH).json()["status"] == "stopped"
    r = client.post("/sweeps/s1/resume", headers=AUTH)
    assert r.status_code == 409
    r = _queue(client, target, 1)
    assert r.status_code == 409  # nothing would run it


def test_auth_on_loopback(tmp_path: Path, target: Path) -> None:
    with _client(tmp_path, signed_in=False) as client:
        r = client.post("/sweeps", json={"name": "s1", "target": str(target)})
        assert r.status_code == 401 and _code(r) == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
        r = client.post("/sweeps", json={"name": "s1", "target": str(target)},
                        headers={"Authorization": "Bearer wrong-token-000000000"})
        assert r.status_code == 401
        r = client.get("/sweeps")  # every user of the machine can reach loopback
        assert r.status_code == 401 and "overnight token" in r.json()["detail"]["message"]
        assert client.get("/sweeps", headers=AUTH).json()["count"] == 0
        assert client.get("/health").status_code == 200


def test_open_reads_on_loopback(tmp_path: Path) -> None:
    with _client(tmp_path, signed_in=False, read_auth=False) as client:
        assert client.get("/sweeps").status_code == 200
        assert client.get("/ui/").status_code == 200
        r = client.post("/sweeps", json={"name": "s1", "target": "/x"})
        assert r.status_code == 401  # writes still need the token


def test_the_start_up_warning_names_who_reads_without_the_token(tmp_path: Path) -> None:
    def warning(**values: object) -> str | None:
        return Settings.build(db_path=tmp_path / "o.db", **values).open_access_warning(8123)

    assert warning(token=TOKEN) is None  # the default: the token guards every read
    assert warning(token=TOKEN, host="0.0.0.0") is None
    mine = warning(token=TOKEN, read_auth=False)
    assert mine is not None and mine.startswith("reads are open (--open-reads): every user of "
                                                "this machine (anyone who can connect to "
                                                "127.0.0.1:8123) can read every sweep")
    assert "writes and MCP still need the token" in mine
    network = warning(token=TOKEN, read_auth=False, host="0.0.0.0")
    assert network is not None and "anyone who can reach 0.0.0.0:8123 over the network" in network
    off = warning(auth=False)
    assert off is not None and off.startswith("auth is off (--no-auth): every user of this")
    assert "queue code that runs as this service's user" in off


def test_reads_need_token_when_exposed(tmp_path: Path) -> None:
    with _client(tmp_path, signed_in=False, host="0.0.0.0") as c:
        assert c.get("/experiments").status_code == 401
        assert c.get("/experiments", headers=AUTH).status_code == 200
        assert c.get("/health").status_code == 200  # liveness probes need no token
        r = c.get("/login", params={"token": TOKEN, "next": "/experiments"},
                  follow_redirects=False)  # a token in a URL is never taken
        assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=/experiments"
        assert "set-cookie" not in r.headers and c.get("/experiments").status_code == 401
        r = c.post("/login", data={"token": "nope-nope-nope-nope", "next": "/experiments"})
        assert r.status_code == 401 and "not this server" in r.text and not c.cookies
        r = c.post("/login", data={"token": TOKEN, "next": "/experiments"},
                   follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/experiments"
        assert "httponly" in r.headers["set-cookie"].lower()
        assert c.get("/experiments").status_code == 200  # the cookie now authorises reads
        r = c.post("/sweeps", json={"name": "x", "target": "/x"})
        assert r.status_code == 401  # but never writes


def test_auth_off(tmp_path: Path, target: Path) -> None:
    with _client(tmp_path, signed_in=False, auth=False, token=None) as c:
        r = c.post("/sweeps", json={"name": "s1", "target": str(target), "proposer": "queue"})
        assert r.status_code == 201


def test_unsafe_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="auth disabled"):
        Settings.build(db_path=tmp_path / "x.db", host="0.0.0.0", auth=False)
    with pytest.raises(ConfigError, match="no token"):
        Settings.build(db_path=tmp_path / "x.db")
    with pytest.raises(ConfigError, match="16 characters"):
        Settings.build(db_path=tmp_path / "x.db", token="short")
    with pytest.raises(ConfigError, match="slots"):
        Settings.build(db_path=tmp_path / "x.db", token=TOKEN, slots=-1)


def test_token_file_is_private_and_stable(tmp_path: Path) -> None:
    token, path, created = ensure_token(tmp_path / "o.db")
    assert created and len(token) >= 32 and (path.stat().st_mode & 0o777) == 0o600
    assert ensure_token(tmp_path / "o.db") == (token, path, False)


def test_best_results_log_and_sse(client: TestClient, target: Path, tmp_path: Path) -> None:
    from agent.engine.loop import Loop, LoopSettings
    from agent.executors.local import SubprocessRunner

    _sweep(client, target)
    _queue(client, target, 4, 1)
    _queue(client, target, 5, -1)
    services = client.app.state.services  # type: ignore[attr-defined]
    sweep = services.store.get_sweep("s1")
    loop = Loop(services.store, services.repo_for(sweep), SubprocessRunner(grace_s=0.5),
                LoopSettings(work_dir=tmp_path / "work"))
    for _ in range(3):
        loop.execute(sweep, services.store.claim_next(sweep.id))
    tsv = client.get("/sweeps/s1/results.tsv")
    assert tsv.headers["content-type"].startswith("text/tab-separated-values")
    rows = [line.split("\t") for line in tsv.text.splitlines()]
    assert rows[0] == ["commit", "val_bpb", "memory_gb", "status", "description"]
    assert [r[3] for r in rows[1:]] == ["keep", "keep", "discard"]
    best = client.get("/sweeps/s1/best").json()
    assert best["metric"] == pytest.approx(1.299) and len(best["kept"]) == 1
    assert "K4 = 1" in best["files"]["train.py"] and "K5 = 0" in best["files"]["train.py"]
    assert best["commit"] == services.repo_for(sweep).head("overnight/s1")
    log = client.get("/experiments/2/log")
    assert "val_bpb" in log.text
    with client.stream("GET", "/experiments/2/log", params={"follow": 1}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        body = "".join(r.iter_text())
    assert "data: ---" in body and "event: end" in body
    end = body.split("event: end\n")[1].splitlines()[0].removeprefix("data: ")
    assert json.loads(end)["status"] == "kept"


def test_insights_of_a_recorded_sweep(client: TestClient, target: Path, tmp_path: Path) -> None:
    from agent.engine.loop import Loop, LoopSettings
    from agent.executors.local import SubprocessRunner

    _sweep(client, target)
    _queue(client, target, 4, 1)
    _queue(client, target, 5, -1)
    services = client.app.state.services  # type: ignore[attr-defined]
    sweep = services.store.get_sweep("s1")
    loop = Loop(services.store, services.repo_for(sweep), SubprocessRunner(grace_s=0.5),
                LoopSettings(work_dir=tmp_path / "work"))
    for _ in range(3):
        loop.execute(sweep, services.store.claim_next(sweep.id))
    r = client.get("/sweeps/s1/insights")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["sweep"] == "s1" and body["data"]["counts"] == {"kept": 1, "discarded": 1}
    assert {k["name"]: k["current"] for k in body["data"]["knobs"]} == {"K4": "1", "K5": "0"}
    assert "- K4 [hyperparameter] now 1; 1 runs; tried 1; gain by direction: up +0.001" \
        in body["text"]
    assert "down -" in body["text"].split("- K5")[1]
    short = client.get("/sweeps/s1/insights", params={"max_chars": 500}).json()["text"]
    assert len(short) <= 500 and short.startswith("# Sweep s1")
    assert client.get("/sweeps/nope/insights").status_code == 404
    assert client.get("/sweeps/s1/insights", params={"max_chars": 5}).status_code == 422


def test_health_and_metrics(client: TestClient, target: Path) -> None:
    _sweep(client, target)
    h = client.get("/health").json()
    assert h["db"] == "ok" and h["scheduler"] == "disabled" and h["queue_depth"] == 1
    m = client.get("/metrics").text
    assert 'overnight_experiments{status="queued"} 1' in m


def test_openapi_lists_every_route(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for p in ("/sweeps", "/sweeps/{name}", "/sweeps/{name}/pause", "/sweeps/{name}/resume",
              "/sweeps/{name}/stop", "/sweeps/{name}/best", "/sweeps/{name}/results.tsv",
              "/sweeps/{name}/insights",
              "/experiments", "/experiments/{experiment_id}", "/experiments/{experiment_id}/diff",
              "/experiments/{experiment_id}/log", "/health", "/metrics"):
        assert p in paths, p


def test_follow_a_running_log_and_cancel_a_running_experiment(tmp_path: Path) -> None:
    target = make_counting_target(tmp_path / "slow", sleep_s=1.5, n_knobs=4)
    with _client(tmp_path, run_scheduler=True, poll_interval_s=0.05, grace_s=0.5) as c:
        _sweep(c, target, budget_s=2)
        cancel_id = _queue(c, target, 1).json()["id"]
        with c.stream("GET", "/experiments/1/log", params={"follow": 1}) as r:
            events = []
            for line in r.iter_lines():
                events.append(line)
                if line.startswith("event: end"):
                    break
        assert events[0] == "event: status" and "data: step 1 | loss 5.0000" in "\n".join(
            events[:8])
        assert any(e.startswith("data: val_bpb:") for e in events)
        wait_for(lambda: _log_has(c, cancel_id, "step 1 "), 60, "the run to print a step")
        r = c.delete(f"/experiments/{cancel_id}", headers=AUTH)
        assert r.status_code == 202 and r.json()["pending"] is True
        exp = wait_for(lambda: _finished(c, cancel_id), 60, "the cancelled run to end")
        assert exp["status"] == "cancelled" and exp["reason"] == "cancelled while running"
        # the slot lets go of the run just after recording it
        health = wait_for(lambda: _idle_health(c), 60, "the slot to be free")
        assert health["scheduler"] == "running" and health["busy"] == 0


def _finished(c: TestClient, exp_id: int) -> dict | None:
    exp = c.get(f"/experiments/{exp_id}").json()
    return exp if exp["status"] not in ("queued", "running") else None


def _idle_health(c: TestClient) -> dict | None:
    health = c.get("/health").json()
    return health if health["busy"] == 0 else None


def _log_has(c: TestClient, exp_id: int, text: str) -> bool:
    r = c.get(f"/experiments/{exp_id}/log")
    return r.status_code == 200 and text in r.text


def test_cancel_between_claim_and_run_is_honoured(tmp_path: Path, target: Path) -> None:
    """A slot has claimed the experiment (status `running`) but not started it yet: DELETE is
    accepted (it used to answer 409 until the run registered its stop event) and the experiment
    is recorded cancelled without running."""
    with _client(tmp_path, run_scheduler=True, poll_interval_s=0.05, grace_s=0.5) as c:
        sched = c.app.state.services.scheduler  # type: ignore[attr-defined]
        claimed, release = threading.Event(), threading.Event()
        execute = sched._execute

        def held_after_claim(slot, sweep, exp, loop):  # type: ignore[no-untyped-def]
            if not exp.is_baseline:  # widen the claim -> run window deterministically
                claimed.set()
                release.wait(60)
            execute(slot, sweep, exp, loop)

        sched._execute = held_after_claim
        _sweep(c, target)
        wait_for(lambda: c.get("/sweeps/s1").json()["best_metric"] is not None, 60,
                 "the baseline to be kept")
        exp_id = _queue(c, target, 1).json()["id"]
        assert claimed.wait(60), "the slot never claimed the experiment"
        assert c.get(f"/experiments/{exp_id}").json()["status"] == "running"
        try:
            r = c.delete(f"/experiments/{exp_id}", headers=AUTH)
        finally:
            release.set()
        assert r.status_code == 202, r.text
        assert r.json()["pending"] is True
        exp = wait_for(lambda: _finished(c, exp_id), 60, "the cancelled experiment to end")
        assert exp["status"] == "cancelled" and exp["reason"] == "cancelled before it started"
        assert exp["log_path"] is None  # it never ran
        assert wait_for(lambda: _idle_health(c), 60, "the slot to be free")["busy"] == 0


HOLD_ON_CONFIRM = """
HOLD = False  # knobs: skip
if HOLD and seed != 42:  # a confirmation run (seed 43) that waits to be cancelled
    print("holding", flush=True)
    time.sleep(600)
"""


def test_cancel_during_a_confirmation_run_is_recorded_cancelled(tmp_path: Path) -> None:
    fixture = Path(__file__).parent / "fixtures" / "fake_target"
    text = (fixture / "train.py").read_text()
    seed_line = 'seed = int(os.environ.get("OVERNIGHT_SEED", "42"))\n'
    assert seed_line in text
    toml = (fixture / "overnight.toml").read_text() + "confirm_runs = 1\n"
    noisy = text.replace("NOISE = 0.0", "NOISE = 0.01")  # σ̂ measured: a better run runs again
    target = make_target(tmp_path / "confirm", edits={
        "train.py": noisy.replace(seed_line, seed_line + HOLD_ON_CONFIRM),
        "overnight.toml": toml})
    better_and_held = make_diff_of(target, [("LR = 0.01", "LR = 0.02"),
                                            ("HOLD = False", "HOLD = True")])
    with _client(tmp_path, run_scheduler=True, poll_interval_s=0.05, grace_s=0.5) as c:
        _sweep(c, target, name="conf")
        r = c.post("/experiments", headers=AUTH, json={
            "sweep": "conf", "description": "lr 0.02", "diff": better_and_held})
        assert r.status_code == 201, r.text
        exp_id = r.json()["id"]
        work = c.app.state.services.runtime.work_dir  # type: ignore[attr-defined]
        confirm_log = work / "logs" / "conf" / f"{exp_id}.run2.log"  # its second run
        wait_for(lambda: confirm_log.is_file() and "holding" in confirm_log.read_text(), 60,
                 "the confirmation run to start")
        r = c.delete(f"/experiments/{exp_id}", headers=AUTH)
        assert r.status_code == 202 and r.json()["pending"] is True, r.text
        exp = wait_for(lambda: _finished(c, exp_id), 60, "the cancelled experiment to end")
        assert exp["status"] == "cancelled", exp
        assert exp["reason"].startswith("cancelled during a confirmation run"), exp["reason"]
        sweep = c.get("/sweeps/conf").json()
        (base,) = [e for e in c.get("/experiments", headers=AUTH).json()["data"]
                   if e["is_baseline"]]
        assert sweep["best_metric"] == base["metric"]  # the baseline is still the best
        assert base["metric"] == pytest.approx(1.3, abs=0.01)


def make_diff_of(target: Path, pairs: list[tuple[str, str]]) -> str:
    from agent.proposers.knobs import make_diff

    old = (target / "train.py").read_text()
    new = old
    for a, b in pairs:
        assert a in new
        new = new.replace(a, b, 1)
    return make_diff("train.py", old, new)


def test_scheduled_start_via_api(tmp_path: Path, target: Path) -> None:
    from datetime import UTC, datetime, timedelta

    when = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    with _client(tmp_path, run_scheduler=True, slots=0) as c:
        sweep = _sweep(c, target, start_at=when.isoformat())
        assert sweep["status"] == "paused"
        assert sweep["scheduled_start"].startswith(when.strftime("%Y-%m-%dT%H:%M:%S"))
    with _client(tmp_path, run_scheduler=True, slots=0) as c:  # a restart keeps it
        assert c.get("/sweeps/s1").json()["scheduled_start"] is not None


def test_the_sweep_list_says_what_each_sweep_says(tmp_path: Path, target: Path) -> None:
    """GET /sweeps reads counts and scheduled starts once for the whole list: each listed
    sweep equals GET /sweeps/{name} (counts per status, a scheduled start, none)."""
    when = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    with _client(tmp_path, run_scheduler=True, slots=0) as c:
        _sweep(c, target, "a")
        for knob in range(3):
            assert _queue(c, target, knob, sweep="a").status_code == 201
        _sweep(c, target, "b", start_at=when.isoformat())
        _sweep(c, target, "c")
        assert c.post("/sweeps/c/stop", headers=AUTH).status_code == 200
        listed = c.get("/sweeps").json()
        assert listed["count"] == 3
        one_by_one = [c.get(f"/sweeps/{name}").json() for name in "abc"]
        assert listed["data"] == one_by_one
        counts = {s["name"]: s["counts"] for s in listed["data"]}
        assert counts["a"] == {"queued": 4} and counts["b"] == {"queued": 1}
        assert [s["scheduled_start"] is not None for s in listed["data"]] == [False, True, False]


def test_a_scheduled_start_fires_and_the_sweep_runs(tmp_path: Path, target: Path) -> None:
    """The APScheduler date job itself (not start_now called by hand): a start a moment ahead
    resumes the paused sweep and its baseline runs."""
    from datetime import UTC, datetime, timedelta

    with _client(tmp_path, run_scheduler=True, poll_interval_s=0.05, grace_s=0.5) as c:
        when = datetime.now(UTC) + timedelta(seconds=2)
        sweep = _sweep(c, target, start_at=when.isoformat())
        assert sweep["status"] == "paused" and sweep["scheduled_start"] is not None
        wait_for(lambda: c.get("/sweeps/s1").json()["status"] == "running", 60,
                 "the scheduled start to fire")
        assert datetime.now(UTC) >= when  # not before its time
        base = wait_for(lambda: _finished(c, 1), 60, "the baseline to run")
        assert base["status"] == "kept"
        assert c.get("/sweeps/s1").json()["scheduled_start"] is None  # a one-off job, gone
