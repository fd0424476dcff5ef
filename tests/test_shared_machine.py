"""A shared GPU box: another Unix user of the machine reads nothing of the night.

As root, the test makes a second user, runs a real `overnight serve` (uvicorn on loopback,
SQLite) owned by root through a real night, and from a process of the second user (a stdlib
Python started with its uid and gid): every read route and every dashboard page and log answers
401, and no file the service wrote opens. The owner, with the token that `overnight token`
prints, reads all of it. With `--open-reads` the second user reads, and the start-up warning
says who can. Skips cleanly when not root.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_fixtures import TOKEN, ServerProcess, knob_diff, make_counting_target, wait_for
from starlette.routing import Mount

from api.settings import Settings
from overnight.runtime import service_app

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0
                       or not shutil.which("useradd"),
                       reason="needs root and useradd (it creates a second Unix user)"),
    pytest.mark.timeout(900),  # a whole night of fake runs, on a busy machine
]

# GET routes that stay open: liveness, the login form, static assets, the API's description.
OPEN_ROUTES = {"/health", "/ui/login", "/login", "/ui/static/{name}", "/docs", "/redoc",
               "/openapi.json"}
FINISHED = {"kept", "discarded", "crashed", "timeout"}
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")

# Run as the second user with a system Python (-I -S: the standard library only).
PROBE = r"""
import errno, json, os, sys, urllib.error, urllib.request

spec = json.load(sys.stdin)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


opener = urllib.request.build_opener(NoRedirect)
out = {"http": [], "files": {}}
for method, url, headers in spec["requests"]:
    request = urllib.request.Request(url, method=method, headers=headers,
                                     data=b"{}" if method == "POST" else None)
    try:
        with opener.open(request, timeout=120) as r:
            out["http"].append([method, url, r.status, r.read().decode("utf-8", "replace")])
    except urllib.error.HTTPError as e:
        out["http"].append([method, url, e.code, e.read().decode("utf-8", "replace")])
for path, is_dir in spec["files"]:
    try:
        if is_dir:
            os.listdir(path)
        else:
            open(path, "rb").close()
        out["files"][path] = "opened"
    except OSError as e:
        out["files"][path] = errno.errorcode.get(e.errno, str(e.errno))
json.dump(out, sys.stdout)
"""


@dataclass
class OtherUser:
    name: str
    uid: int
    gid: int
    python: str

    def probe(self, requests: list[tuple[str, str, dict[str, str]]],
              files: list[tuple[str, bool]] | None = None) -> dict[str, Any]:
        """Run PROBE as this user: (method, url, status, body) per request, errno per file."""
        proc = subprocess.run(
            [self.python, "-I", "-S", "-c", PROBE], input=json.dumps(
                {"requests": requests, "files": files or []}),
            user=self.uid, group=self.gid, extra_groups=[], cwd="/", capture_output=True,
            text=True, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)  # type: ignore[no-any-return]


@dataclass
class Night:
    """A finished night on a shared machine: its folders and what the service made."""

    base: Path  # 0755, as a folder in /tmp or a home often is
    home: Path  # the database's folder (made by us, 0755: the service warns about it)
    db: Path
    target: Path
    before: dict[str, tuple[int, int]]  # path -> (inode, mtime) before the service ever ran
    sweep: str
    change: dict[str, Any]  # the queued experiment, finished
    logs: Path  # the server's own output (the test's, not the service's file)


@pytest.fixture(scope="module")
def other_user() -> Iterator[OtherUser]:
    name = f"ovn{uuid.uuid4().hex[:10]}"
    made = _with_passwd_lock(["useradd", "--no-create-home", "--user-group", "--shell",
                              "/usr/sbin/nologin", name])
    if made.returncode != 0:
        pytest.skip(f"useradd {name} failed: {made.stderr.strip()}")
    try:
        entry = pwd.getpwnam(name)
        python = next((p for p in SYSTEM_PYTHONS if _runs_as(p, entry.pw_uid, entry.pw_gid)),
                      None)
        if python is None:
            pytest.skip(f"no Python the user {name} may run ({', '.join(SYSTEM_PYTHONS)})")
        yield OtherUser(name, entry.pw_uid, entry.pw_gid, python)
    finally:
        gone = _with_passwd_lock(["userdel", name])
        _with_passwd_lock(["groupdel", name])  # when userdel left it
        assert gone.returncode == 0, f"userdel {name}: {gone.stderr}"


def _with_passwd_lock(argv: list[str], tries: int = 20) -> subprocess.CompletedProcess[str]:
    """useradd/userdel, tried again while another process holds the lock on /etc/passwd."""
    for _ in range(tries):
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 10 and "lock" not in done.stderr:
            return done
        time.sleep(0.5)
    return done


def _runs_as(python: str, uid: int, gid: int) -> bool:
    if not Path(python).exists():
        return False
    proc = subprocess.run([python, "-I", "-S", "-c", "import json, urllib.request"],
                          user=uid, group=gid, extra_groups=[], cwd="/", capture_output=True)
    return proc.returncode == 0


def _server(night: Night, *extra: str) -> ServerProcess:
    """`overnight serve` on the night's database, with its own token file (no
    $OVERNIGHT_TOKEN) and the usual umask of a login shell."""
    server = ServerProcess(night.db, log=night.logs, extra=["--log-level", "info", *extra])
    server.env = {k: v for k, v in os.environ.items() if k != "OVERNIGHT_TOKEN"}
    return server


def _token(night: Night) -> str:
    """What a user of the night's database gets from `overnight token`."""
    cli = str(Path(sys.executable).with_name("overnight"))
    env = {k: v for k, v in os.environ.items() if k != "OVERNIGHT_TOKEN"}
    run = subprocess.run([cli, "token", "--db", str(night.db)], capture_output=True, text=True,
                         env=env, timeout=120, check=True)
    return run.stdout.strip()


def _snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for root in roots:
        for path in [root, *root.rglob("*")]:
            st = path.lstat()
            out[str(path)] = (st.st_ino, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def night(other_user: OtherUser, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Night]:
    old = os.umask(0o022)  # the usual umask: what the service writes must be private anyway
    base = Path(tempfile.mkdtemp(prefix="overnight-shared-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        home = base / "home"
        home.mkdir()
        os.chmod(home, 0o755)
        target = make_counting_target(base / "target", n_knobs=2)
        logs = tmp_path_factory.mktemp("shared") / "server.log"
        made = Night(base, home, home / "o.db", target, _snapshot(home, target), "night", {},
                     logs)
        server = _server(made).start()
        try:
            with httpx.Client(base_url=server.url, timeout=60,
                              headers={"Authorization": f"Bearer {_token(made)}"}) as c:
                r = c.post("/sweeps", json={"name": "night", "target": str(target),
                                            "budget_s": 1, "max_experiments": 1,
                                            "proposer": "queue"})
                assert r.status_code == 201, r.text
                r = c.post("/experiments", json={"sweep": "night", "description": "K0 = 1",
                                                 "diff": knob_diff(target, 0, 1)})
                assert r.status_code == 201, r.text
                exp_id = r.json()["id"]
                made.change = wait_for(
                    lambda: (e := c.get(f"/experiments/{exp_id}").json())["status"] in FINISHED
                    and e, 300, "the change to finish")
                wait_for(lambda: c.get("/experiments", params=[
                    ("status", "queued"), ("status", "running")]).json()["count"] == 0, 300,
                    "the queue to empty")
        finally:
            server.stop()
        yield made
    finally:
        os.umask(old)
        shutil.rmtree(base, ignore_errors=True)


def _get_routes() -> list[str]:
    """The path of every GET route of the real app, dashboard and MCP included."""
    folder = Path(tempfile.mkdtemp())
    try:
        app = service_app(Settings(db_path=folder / "routes.db", token=TOKEN, slots=0,
                                   run_scheduler=False))
        paths: set[str] = set()

        def walk(routes: list[Any]) -> None:
            for route in routes:
                inner = getattr(route, "original_router", None)
                if inner is not None:  # an included router
                    walk(inner.routes)
                elif hasattr(route, "path") and not isinstance(route, Mount):
                    methods = getattr(route, "methods", None)
                    if methods is None or "GET" in methods:
                        paths.add(route.path)

        walk(app.router.routes)
        return sorted(paths)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _read_urls(url: str, night: Night) -> list[str]:
    """Every read route and dashboard page, filled in with the night's sweep and change."""
    values = {"name": night.sweep, "experiment_id": str(night.change["id"]),
              "exp_id": str(night.change["id"]), "path": "train.py"}
    out = []
    for path in _get_routes():
        if path in OPEN_ROUTES or path.rstrip("/") == "/mcp":
            continue
        filled = re.sub(r"\{(\w+)(:\w+)?\}", lambda m: values[m.group(1)], path)
        out.append(url + filled)
    return out


def _service_files(night: Night) -> list[tuple[str, bool]]:
    """Every file and folder the service made or rewrote since before its first start (the
    database's and the target's folders themselves are ours)."""
    now = _snapshot(night.home, night.target)
    return sorted((path, Path(path).is_dir()) for path, stamp in now.items()
                  if (path not in night.before or (stamp != night.before[path]
                                                   and not Path(path).is_dir())))


def _started(night: Night, *extra: str) -> tuple[ServerProcess, int]:
    """A started server, and where its output begins in the log."""
    offset = night.logs.stat().st_size if night.logs.exists() else 0
    return _server(night, *extra).start(), offset


def test_another_user_of_the_machine_reads_nothing(night: Night, other_user: OtherUser) -> None:
    server, offset = _started(night)
    try:
        token = _token(night)
        reads = _read_urls(server.url, night)
        exp = night.change["id"]
        assert f"{server.url}/ui/experiments/{exp}/log.txt" in reads
        assert {f"{server.url}/experiments", f"{server.url}/sweeps", f"{server.url}/",
                f"{server.url}/ui/", f"{server.url}/experiments/{exp}",
                f"{server.url}/ui/experiments/{exp}"} <= set(reads)
        reads.append(f"{server.url}/experiments/{exp}/log?follow=1")
        requests = [("GET", u, {}) for u in reads]
        requests += [("GET", u, {"Authorization": "Bearer " + "x" * 40}) for u in reads]
        requests += [("GET", u, {"Cookie": "overnight_token=" + "x" * 40}) for u in reads]
        requests += [("POST", f"{server.url}/mcp", {"Content-Type": "application/json"}),
                     ("GET", f"{server.url}/health", {})]
        files = _service_files(night)
        seen = other_user.probe(requests, files)

        *refused, mcp, health = seen["http"]
        answered = {(m, u, status) for m, u, status, _ in refused}
        assert {status for _, _, status in answered} == {401}, sorted(answered)
        secret_bits = ("K0 = 1", "val_bpb", night.change["commit"] or "K0 = 1", str(night.base))
        for _, url, _, body in refused:  # a refusal says nothing of the night
            assert not any(bit in body for bit in secret_bits), (url, body[:300])
        pages = [body for _, u, _, body in refused
                 if ("/ui/" in u or u.endswith("/")) and not u.endswith(("/live", "/tail"))]
        assert len(pages) >= 3 * 8  # each page three ways: no token, a wrong one, a bad cookie
        assert all('action="/login"' in body and "overnight token" in body for body in pages)
        assert mcp[2] == 401 and health[2] == 200

        names = {path for path, _ in files}
        for must in (night.db, Path(f"{night.db}.token"), Path(f"{night.db}.lock"),
                     Path(f"{night.db}-wal"), Path(f"{night.db}.work")):
            assert str(must) in names, must
        assert any("/logs/" in p and p.endswith(".log") for p in names), names
        assert any("/.git/objects/" in p for p in names), names  # the night's commits
        assert any(p.startswith(f"{night.db}.work/worktrees") for p in names), names
        opened = {p: e for p, e in seen["files"].items() if e != errno.errorcode[errno.EACCES]}
        assert not opened, opened  # every one refused: EACCES, not missing

        # The owner, with the token from `overnight token`, reads all of it.
        assert token and token != TOKEN
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {token}"}) as c:
            for url in reads[:-1]:
                r = c.get(url)
                assert r.status_code == 200, (url, r.status_code, r.text[:300])
            assert "+K0 = 1" in c.get(f"{server.url}/experiments/{exp}/diff").text
            assert "val_bpb" in c.get(f"{server.url}/ui/experiments/{exp}/log.txt").text
        with httpx.Client(base_url=server.url, timeout=60,
                          follow_redirects=True) as browser:  # the login form, its cookie
            r = browser.post("/login", data={"token": token, "next": f"/ui/experiments/{exp}"})
            assert r.status_code == 200 and "K0 = 1" in r.text
            assert "val_bpb" in browser.get(f"/ui/experiments/{exp}/log.txt").text
    finally:
        server.stop()
    start = night.logs.read_text(errors="replace")[offset:]
    told = next(line for line in start.splitlines() if line.startswith("token read from"))
    assert f"{night.db}.token" in told and "overnight token --db " in told  # where, and how
    assert start.count("is open to other users") == 1  # the database's folder, said once
    assert "reads are open" not in start and "sign in with the token" in start


def test_open_reads_let_every_user_read_and_say_so(night: Night, other_user: OtherUser) -> None:
    server, offset = _started(night, "--open-reads")
    try:
        reads = _read_urls(server.url, night)
        seen = other_user.probe(
            [("GET", u, {}) for u in reads]
            + [("POST", f"{server.url}/sweeps/{night.sweep}/pause", {}),
               ("POST", f"{server.url}/mcp", {"Content-Type": "application/json"})],
            [(str(night.db), False), (f"{night.db}.token", False)])
        *got, pause, mcp = seen["http"]
        assert {(u, status) for _, u, status, _ in got} == {(u, 200) for u in reads}
        log = next(body for _, u, _, body in got if u.endswith("/log.txt"))
        assert "val_bpb" in log  # the whole log, to anyone on the machine
        assert pause[2] == 401 and mcp[2] == 401  # writes and MCP still need the token
        assert set(seen["files"].values()) == {"EACCES"}  # the files stay private
    finally:
        server.stop()
    start = night.logs.read_text(errors="replace")[offset:]
    warning = next(line for line in start.splitlines() if line.startswith("warning:"))
    assert "reads are open (--open-reads): every user of this machine" in warning
    assert "every sweep, experiment, diff, log" in warning and "without the token" in warning
