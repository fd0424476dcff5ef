"""Hostile and careless clients against the real server (`overnight serve` over loopback):
racing duplicates, open redirects, the token in URLs/argv/logs, foreign Host headers, silent
log followers, and edge input that used to answer 500."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from service_fixtures import AUTH, TOKEN, ServerProcess, knob_diff, make_counting_target, wait_for

HOSTILE_NEXT = [
    "//evil.com", "/\\evil.com", "/\\\\evil", "\\\\evil.com", "/%5Cevil.com", "/%5cevil.com",
    "/%2F%2Fevil.com", "/%2Fevil.com", "/%252F%252Fevil.com", "/%255Cevil.com", "/\t/evil.com",
    "/\n/evil.com", "https://evil.com", "http:/evil.com", "evil.com", "/%09/evil.com",
    "//%5Cevil.com", "///evil.com",
]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ServerProcess, Path]]:
    """A real server with one paused sweep (its baseline stays queued: nothing runs)."""
    target = make_counting_target(tmp_path / "target", n_knobs=20)
    server = ServerProcess(tmp_path / "o.db", log=tmp_path / "server.log",
                           extra=["--log-level", "info", "--heartbeat", "0.2"]).start()
    try:
        with server.client() as c:
            r = c.post("/sweeps", json={"name": "s", "target": str(target), "paused": True,
                                        "proposer": "queue"})
            assert r.status_code == 201, r.text
        yield server, target
    finally:
        server.stop()


def test_identical_concurrent_posts_queue_exactly_one(served: tuple[ServerProcess, Path]) -> None:
    server, target = served
    body = {"sweep": "s", "description": "K3 = 1", "diff": knob_diff(target, 3, 1)}
    gate = threading.Barrier(50)
    limits = httpx.Limits(max_connections=50, max_keepalive_connections=50)
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=120, limits=limits) as c:
        def post(_: int) -> httpx.Response:
            gate.wait()  # all 50 in flight together
            return c.post("/experiments", json=body)

        with ThreadPoolExecutor(max_workers=50) as pool:
            responses = list(pool.map(post, range(50)))
        codes = sorted(r.status_code for r in responses)
        assert codes.count(201) == 1, codes
        refused = [r for r in responses if r.status_code != 201]
        assert {r.status_code for r in refused} == {422}
        assert {r.json()["detail"]["code"] for r in refused} == {"duplicate"}
        page = c.get("/experiments", params={"sweep": "s", "status": "queued"}).json()
        assert [e["description"] for e in page["data"]].count("K3 = 1") == 1
        assert page["count"] == 2  # the baseline and one copy
    assert "Traceback" not in server.tail(1_000_000)


def test_login_never_redirects_off_site(served: tuple[ServerProcess, Path]) -> None:
    server, _ = served
    for next_ in HOSTILE_NEXT:
        r = httpx.post(f"{server.url}/login", data={"token": TOKEN, "next": next_},
                       follow_redirects=False)
        assert r.status_code == 303, r.text
        assert r.headers["location"] == "/", (next_, r.headers["location"])
        form = httpx.get(f"{server.url}/ui/login", params={"next": next_})
        assert 'name="next" value="/"' in form.text, next_


def test_login_is_a_post_and_the_token_stays_out_of_urls_and_logs(
        served: tuple[ServerProcess, Path]) -> None:
    server, _ = served
    form = httpx.get(f"{server.url}/ui/login", params={"next": "/ui/sweeps/s"})
    assert 'method="post"' in form.text and 'action="/login"' in form.text
    r = httpx.post(f"{server.url}/login", data={"token": TOKEN, "next": "/ui/sweeps/s?page=2"},
                   follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/sweeps/s?page=2"
    assert f"overnight_token={TOKEN}" in r.headers["set-cookie"]
    r = httpx.get(f"{server.url}/login", params={"token": TOKEN}, follow_redirects=False)
    assert r.status_code == 303 and "set-cookie" not in r.headers  # a URL token is ignored
    # ...and redacted from the access log line that records the URL
    bad = httpx.post(f"{server.url}/login", data={"token": "x" * 20, "next": "/"})
    assert bad.status_code == 401 and "set-cookie" not in bad.headers
    wait_for(lambda: "POST /login" in server.tail(1_000_000), 30, "the access log line")
    log = server.tail(1_000_000)
    assert TOKEN not in log and "GET /login?token=[redacted]" in log


def test_serve_refuses_a_token_in_argv_and_reads_a_token_file(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OVERNIGHT_TOKEN"}
    refused = ServerProcess(tmp_path / "a.db", log=tmp_path / "a.log", env={})
    refused.argv += ["--token", TOKEN]
    run = subprocess.run(refused.argv, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--token-file" in run.stderr and "ps" in run.stderr
    assert not (tmp_path / "a.db").exists()  # refused before anything was made
    secret = tmp_path / "token"
    secret.write_text("file-token-0123456789abcdef\n")
    server = ServerProcess(tmp_path / "b.db", log=tmp_path / "b.log")
    server.env = {**env}
    server.argv += ["--token-file", str(secret)]
    server.start()
    try:
        assert server.proc is not None
        argv = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().decode()
        assert "file-token" not in argv
        ok = httpx.post(f"{server.url}/sweeps/x/pause",
                        headers={"Authorization": "Bearer file-token-0123456789abcdef"})
        assert ok.status_code == 404  # authorised; the sweep just does not exist
        assert httpx.post(f"{server.url}/sweeps/x/pause", headers=AUTH).status_code == 401
    finally:
        server.stop()


def _connect(url: str) -> socket.socket:
    ip, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((ip, int(port)), timeout=30)


def _raw_get(url: str, host: str) -> int:
    """GET /health with a chosen Host header (httpx would fill in the real one)."""
    with _connect(url) as sock:
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
                     .encode())
        return int(sock.makefile("rb").readline().split()[1])


def test_foreign_host_headers_are_refused(served: tuple[ServerProcess, Path]) -> None:
    server, _ = served
    port = server.url.rsplit(":", 1)[1]
    for good in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST"):
        assert _raw_get(server.url, good) == 200, good
    for evil in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}",
                 "[::2]:80"):
        assert _raw_get(server.url, evil) == 400, evil
    r = httpx.get(f"{server.url}/experiments", headers={"Host": "rebound.example"})
    assert r.status_code == 400 and r.json()["detail"]["code"] == "bad_host"


def _metric(server: ServerProcess, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", headers=AUTH, timeout=30).text
    line = next(x for x in text.splitlines() if x.startswith(name + " "))
    return float(line.split()[1])


def test_silent_followers_hold_no_thread_and_end_with_their_clients(
        served: tuple[ServerProcess, Path]) -> None:
    """More silent followers than the thread pool has threads (40): /health still answers, a
    heartbeat arrives while the log says nothing, and closing the clients ends every stream."""
    server, _ = served
    n = 60
    socks = []
    try:
        for _ in range(n):
            sock = _connect(server.url)
            sock.sendall(b"GET /experiments/1/log?follow=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
            socks.append(sock)
        wait_for(lambda: _metric(server, "overnight_log_followers") == n, 60,
                 f"{n} followers to be streaming")
        health = httpx.get(f"{server.url}/health", timeout=30)
        assert health.status_code == 200 and health.json()["queue_depth"] == 1
        seen = b""
        while b": heartbeat" not in seen:  # the baseline is queued: its log is silent
            chunk = socks[0].recv(4096)
            assert chunk, "the stream closed"
            seen += chunk
        assert b"event: status" in seen and b"data: " in seen
    finally:
        for sock in socks:
            sock.close()
    wait_for(lambda: _metric(server, "overnight_log_followers") == 0, 60,
             "the abandoned followers to end")


def test_upgrade_rejects_copies_queued_by_the_old_race_then_refuses_new_ones(
        tmp_path: Path, target: Path) -> None:
    """A database from before the unique index, holding three queued copies of one change."""
    from sqlalchemy import text

    from agent.core.domain import Proposal
    from agent.core.errors import DuplicateError
    from db.engine import make_engine, migrate
    from db.store import SqlStore, diff_key

    engine = make_engine(tmp_path / "old.db")
    migrate(engine, "0001")  # the schema as that release left it
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO sweeps (id, name, target_path, branch, status, proposer, config, "
            "protected_hashes, seed, min_delta, llm_tokens_in, llm_tokens_out, llm_usd, "
            "created_at, updated_at) VALUES (1, 's', '/t', 'overnight/s', 'running', 'queue', "
            "'{}', '{}', 42, 0, 0, 0, 0, '2026-11-29 00:00:00', '2026-11-29 00:00:00')"))
        diff = knob_diff(target, 1, 1)
        for i in range(1, 4):
            conn.execute(text(
                "INSERT INTO experiments (id, sweep_id, attempt, is_baseline, priority, "
                "proposer, description, diff, diff_key, status, summary, meta, llm_tokens_in, "
                "llm_tokens_out, llm_usd, created_at) VALUES (:id, 1, 0, 0, 0, 'external', "
                "'K1', :diff, :key, 'queued', '{}', '{}', 0, 0, 0, '2026-11-29 00:00:00')"),
                {"id": i, "diff": diff, "key": diff_key(diff)})
    migrate(engine)
    store = SqlStore(engine)
    statuses = [(e.id, e.status.value) for e in store.list_experiments(1)]
    # (0002's batch re-creation of `sweeps` once cascaded into deleting every experiment)
    assert statuses == [(1, "queued"), (2, "rejected"), (3, "rejected")], "rows lost"
    assert "duplicate of experiment 1" in (store.get_experiment(2).reason or "")
    with pytest.raises(DuplicateError):
        store.add_experiment(1, Proposal("again", diff, "external"))
    assert len(store.list_experiments(1)) == 3
    engine.dispose()


@pytest.fixture
def target(tmp_path: Path) -> Path:
    return make_counting_target(tmp_path / "target", n_knobs=4)


def test_edge_input_is_a_4xx_naming_the_problem(served: tuple[ServerProcess, Path]) -> None:
    server, target = served
    huge = 2**63  # one past SQLite's INTEGER
    with server.client() as c:
        for method, path in [("GET", f"/experiments/{huge}"),
                             ("GET", f"/experiments/{huge}/diff"),
                             ("GET", f"/experiments/{huge}/log"),
                             ("DELETE", f"/experiments/{huge}"),
                             ("GET", f"/experiments?cursor={huge}"),
                             ("GET", f"/ui/experiments/{huge}"),
                             ("GET", f"/ui/experiments/{huge}/tail"),
                             ("GET", f"/ui/experiments/{huge}/log.txt")]:
            r = c.request(method, path)
            assert r.status_code == 422, (path, r.status_code, r.text)
        assert c.get(f"/experiments/{2**63 - 1}").status_code == 404  # the largest id is fine
        for raw, why in [("~nosuchuser-h9/x", "cannot expand"), ("/tmp/" + "x" * 300, "too long"),
                         (str(target / "train.py"), "not a folder"), ("/no\x00pe", "NUL")]:
            r = c.post("/sweeps", json={"name": "t", "target": raw})
            assert r.status_code == 422, (raw, r.text)
            message = r.json()["detail"]["message"]
            assert message.startswith("target:") and why in message, message
        not_utf8 = b'{"sweep": "s", "description": "\xff\xfe", "diff": "x"}'
        r = c.post("/experiments", content=not_utf8, headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and r.json()["detail"]["code"] == "malformed_json", r.text
        assert c.get("/sweeps").json()["count"] == 1
        doc = c.get("/openapi.json").json()["paths"]
    post = doc["/experiments"]["post"]["responses"]
    assert {"201", "401", "404", "409", "413", "422"} <= set(post)
    assert post["409"]["content"] == {"application/json": {
        "schema": {"$ref": "#/components/schemas/ErrorPublic"}}}
    diff = doc["/experiments/{experiment_id}/diff"]["get"]["responses"]
    assert "text/x-diff" in diff["200"]["content"] and "404" in diff
    tsv = doc["/sweeps/{name}/results.tsv"]["get"]["responses"]["200"]["content"]
    assert "text/tab-separated-values" in tsv
    log = doc["/experiments/{experiment_id}/log"]["get"]["responses"]["200"]["content"]
    assert {"text/plain", "text/event-stream"} <= set(log)
    assert doc["/experiments/{experiment_id}"]["get"]["parameters"][0]["schema"]["maximum"] \
        == 2**63 - 1
