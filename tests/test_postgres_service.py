"""The commands and the service on a real PostgreSQL server (tests/pg_server.py): `--db URL`
and OVERNIGHT_DB for run, results, status and agent-instructions, `--work-dir`, the advisory
lock refusing a second engine while a `--no-engine` service queues work for it, and kill -9
recovery on a PostgreSQL database."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from service_fixtures import (
    AUTH,
    ServerProcess,
    kill9_scenario,
    knob_diff,
    make_counting_target,
    wait_for,
)

OVERNIGHT = str(Path(sys.executable).parent / "overnight")


def overnight(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([OVERNIGHT, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


def test_run_results_and_status_on_a_postgresql_url(pg_url: str, tmp_path: Path,
                                                    target: Path) -> None:
    work = tmp_path / "work"
    out = overnight("run", "--target", str(target), "--experiments", "2", "--db", pg_url,
                    "--work-dir", str(work), "--sweep", "pg1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "sweep pg1" in out.stdout and "baseline" in out.stdout
    assert (work / "logs" / "pg1").is_dir()  # the runs' logs went to --work-dir
    tsv = overnight("results", "--sweep", "pg1", "--format", "tsv", "--db", pg_url)
    assert tsv.returncode == 0, tsv.stderr
    rows = [line.split("\t") for line in tsv.stdout.splitlines()[1:]]
    assert len(rows) == 3 and rows[0][3:] == ["keep", "baseline"]
    status = overnight("status", env={"OVERNIGHT_DB": pg_url})  # the URL from the environment
    assert status.returncode == 0, status.stderr
    assert "pg1" in status.stdout and "127.0.0.1" in status.stdout
    brief = overnight("agent-instructions", "--sweep", "pg1", env={"OVERNIGHT_DB": pg_url})
    assert brief.returncode == 0 and "pg1" in brief.stdout, brief.stderr


def test_bad_locations_are_one_clear_error(pg_cluster, tmp_path: Path) -> None:  # type: ignore
    from pg_server import free_port

    for db, message in [
        ("mysql://u@h/x", "unsupported database URL scheme 'mysql'"),
        ("postgresql://u@localhost", "needs a database name"),
        (f"postgresql://postgres@127.0.0.1:{free_port()}/x", "cannot open postgresql://"),
        (pg_cluster.url("no_such_database"), 'database "no_such_database" does not exist'),
    ]:
        proc = overnight("status", "--db", db)
        assert proc.returncode == 2 and message in proc.stderr, (db, proc.stderr)
        assert "Traceback" not in proc.stderr
    env_bad = overnight("status", env={"OVERNIGHT_DB": "mysql://u@h/x"})
    assert env_bad.returncode == 2 and "$OVERNIGHT_DB: unsupported" in env_bad.stderr


def test_one_engine_and_more_api_services_on_one_postgresql_database(pg_url: str,
                                                                     tmp_path: Path) -> None:
    """A second engine is refused by the advisory lock; a `--no-engine` service on the same
    database queues work that the engine's service executes."""
    target = make_counting_target(tmp_path / "target", n_knobs=3)
    server = ServerProcess(pg_url, log=tmp_path / "server.log",
                           extra=["--work-dir", str(tmp_path / "work")]).start()
    api = ServerProcess(pg_url, log=tmp_path / "api.log",
                        extra=["--work-dir", str(tmp_path / "api-work"), "--no-engine"])
    try:
        twin = ServerProcess(pg_url, log=tmp_path / "2.log",
                             extra=["--work-dir", str(tmp_path / "work2")])
        second = subprocess.run(twin.argv, env=twin.env, capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 2
        assert "already using this database" in second.stdout + second.stderr
        assert "advisory lock on postgresql://postgres@127.0.0.1" in second.stderr
        api.start()
        with server.client() as c, api.client() as other:
            assert other.get("/health").json()["scheduler"] == "disabled"
            r = c.post("/sweeps", json={"name": "team", "target": str(target), "budget_s": 1,
                                        "max_experiments": 2, "proposer": "queue"})
            assert r.status_code == 201, r.text
            ids = []
            for client, knob in ((c, 0), (other, 1)):
                r = client.post("/experiments", json={"sweep": "team", "description": f"K{knob}",
                                                      "diff": knob_diff(target, knob, 1)})
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])

            def finished() -> list[str] | None:
                got = [other.get(f"/experiments/{i}").json()["status"] for i in ids]
                return got if all(st in ("kept", "discarded") for st in got) else None

            statuses = wait_for(finished, 120, "both queued experiments to run")
            for page in ("/", "/ui/sweeps/team", f"/ui/experiments/{ids[1]}"):
                for client in (c, other):  # the dashboard of either service
                    r = client.get(page)
                    assert r.status_code == 200, (page, r.text)
                    assert page == "/" or "K1" in r.text, page
        assert len(statuses) == 2
        assert httpx.get(f"{server.url}/health", headers=AUTH).json()["db"] == "ok"
    finally:
        api.stop()
        code = server.stop()
    assert code in (0, -signal.SIGTERM), server.tail()
    assert "Traceback" not in server.tail(100_000), server.tail()
    assert "Traceback" not in api.tail(100_000), api.tail()


def test_kill9_mid_run_on_postgresql_loses_nothing_and_runs_nothing_twice(
        pg_url: str, tmp_path: Path) -> None:
    """The SQLite kill -9 scenario (tests/test_service_server.py) on a PostgreSQL database:
    interrupted runs are re-queued once, finished results never change, nothing runs twice."""
    result = kill9_scenario(tmp_path, kills=2, experiments=5, sleep_s=1.0, seed=3, db=pg_url)
    assert result["problems"] == [], result
    assert result["kills"] == 2 and len(result["interrupted"]) >= 1, result
    assert all(i in result["retries"] for i in result["interrupted"]), result  # each followed up
    assert result["branch_ok"] and result["statuses"].get("queued", 0) == 0


def test_mcp_run_on_postgresql_with_the_official_client(pg_url: str, tmp_path: Path) -> None:
    """`overnight mcp --db URL --run`: a coding agent's tools and the engine on PostgreSQL."""
    from test_mcp import FIXTURE, propose_width_over_stdio

    from agent.git.repo import GitRepo, init_repo
    from agent.ops.sweeps import create_sweep
    from db.engine import open_database
    from db.store import SqlStore

    target = tmp_path / "target"
    shutil.copytree(FIXTURE, target, ignore=shutil.ignore_patterns("__pycache__"))
    init_repo(target)
    engine = open_database(pg_url)
    create_sweep(SqlStore(engine), GitRepo(target), target, name="night", proposer="queue",
                 max_experiments=3)
    engine.dispose()
    work = tmp_path / "mcp-work"
    done, base = propose_width_over_stdio(
        ["mcp", "--db", pg_url, "--run", "--work-dir", str(work)], timeout_s=120)
    assert base["status"] == "kept"
    assert done["status"] == "kept" and done["delta"] == pytest.approx(-0.1)
    assert (work / "logs" / "night").is_dir()  # the runs happened in --work-dir
