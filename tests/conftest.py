"""Shared fixtures: a real git target from the fake trainer, a real SQLite store, a loop."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.engine.loop import Loop, LoopSettings
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo, init_repo
from db.engine import open_database
from db.store import SqlStore

FIXTURES = Path(__file__).parent / "fixtures"
REPO_ROOT = Path(__file__).parent.parent


def make_target(
    dest: Path, source: Path = FIXTURES / "fake_target", edits: dict[str, str] | None = None
) -> Path:
    """Copy a target folder, apply whole-file `edits`, git init and commit it."""
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, text in (edits or {}).items():
        (dest / rel).write_text(text)
    init_repo(dest)
    return dest


def commit_all(repo_path: Path, message: str) -> None:
    """Commit every tracked change in a test target with the service's fixed identity."""
    import git

    from agent.git.repo import IDENTITY

    git.Repo(repo_path).git.commit("-am", message, env=IDENTITY)


@pytest.fixture
def target(tmp_path: Path) -> Path:
    return make_target(tmp_path / "target")


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One prepared-data cache of the GPT target for the whole session, never ~/.cache."""
    return tmp_path_factory.mktemp("overnight-data")


@pytest.fixture
def store(tmp_path: Path) -> SqlStore:
    return SqlStore(open_database(tmp_path / "db" / "overnight.db"))


@pytest.fixture
def make_loop(tmp_path: Path, store: SqlStore):
    def _make(target: Path, proposer=None, **settings) -> Loop:
        return Loop(
            store,
            GitRepo(target),
            SubprocessRunner(grace_s=0.5),
            LoopSettings(work_dir=tmp_path / "work", **settings),
            proposer=proposer,
        )

    return _make


# --- PostgreSQL: one throw-away cluster per session, a fresh database per test -------------
@pytest.fixture(scope="session")
def pg_cluster():
    """A real PostgreSQL server (tests/pg_server.py); skips without its binaries unless
    OVERNIGHT_REQUIRE_POSTGRES=1, where it fails."""
    import os

    import pg_server

    reason = pg_server.why_unavailable()
    if reason is not None:
        if os.environ.get(pg_server.REQUIRE_ENV) == "1":
            pytest.fail(f"{pg_server.REQUIRE_ENV}=1 but {reason}")
        pytest.skip(reason)
    cluster = pg_server.start_cluster()
    try:
        cluster.execute(f"CREATE DATABASE {pg_server.TEMPLATE}")
        open_database(cluster.url(pg_server.TEMPLATE)).dispose()  # the migrations, once
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_url(pg_cluster) -> str:  # type: ignore[no-untyped-def]
    """The URL of a fresh, migrated PostgreSQL database, dropped after the test."""
    url = pg_cluster.create_database()
    yield url
    pg_cluster.drop_database(url)


# --- Slurm: one throw-away one-node cluster per session ----------------------------------
@pytest.fixture(scope="session")
def slurm_cluster():
    """A real one-node Slurm cluster (tests/slurm_cluster.py), its SLURM_CONF set for the
    session; skips without Slurm or root unless OVERNIGHT_REQUIRE_SLURM=1, where it fails."""
    import os

    import slurm_cluster as slurm

    reason = slurm.why_unavailable()
    if reason is not None:
        if os.environ.get(slurm.REQUIRE_ENV) == "1":
            pytest.fail(f"{slurm.REQUIRE_ENV}=1 but {reason}")
        pytest.skip(reason)
    cluster = slurm.start_cluster()
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        cluster.stop()


# The files that take longest (`--durations` on a 2-core machine) run first: the suite runs on
# two workers, a file to a worker (dev.sh test), and a long file started last would leave one
# worker idle while the other finishes it. Their tests are all `slow` (the quick tier,
# `./dev.sh test -m "not slow"`, leaves them out).
LONGEST_FIRST = ("test_cli.py", "test_eval_salvage.py", "test_chaos.py", "test_load_shift.py",
                 "test_llm_real.py", "test_postgres_service.py", "test_adopt_attrs.py",
                 "test_track.py", "test_ray_executor.py", "test_gpt_target.py",
                 "test_schemathesis.py", "test_docs.py", "test_service_server.py",
                 "test_report.py", "test_early_stop.py", "test_runs.py",
                 "test_dashboard_browser.py", "test_dashboard_walk.py", "test_notify.py",
                 "test_gc.py",
                 "test_early_stop_after_keep.py", "test_api_hardening.py",
                 # not long, but left out of the quick tier so that it stays under 5 minutes
                 "test_confirm.py", "test_llm_robust.py", "test_cli_interrupt.py",
                 "test_doctor.py", "test_postgres.py", "test_store_pages.py",
                 "test_llm_proposer.py", "test_adopt_follow.py", "test_finalize.py",
                 "test_shared_machine.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first and `slow` (LONGEST_FIRST; the order within a file is kept).
    Every test on the PostgreSQL cluster is marked `postgres` (-m "not postgres" skips them),
    every test on the Slurm cluster `slurm`."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    for item in items:
        if item.path.name in rank:
            item.add_marker(pytest.mark.slow)
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)
        callspec = getattr(item, "callspec", None)
        if {"pg_cluster", "pg_url"} & set(getattr(item, "fixturenames", ())) or (
                callspec is not None and "postgres" in callspec.params.values()):
            item.add_marker(pytest.mark.postgres)
