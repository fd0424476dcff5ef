"""A throw-away PostgreSQL cluster for the tests: `initdb` and `pg_ctl` from Debian's
`postgresql` package in a temp dir, listening on a free loopback port, stopped and deleted at
the end of the session. initdb refuses to run as root, so as root the cluster belongs to the
`postgres` user the package creates (`runuser -u postgres`).

Without the binaries the tests that need them skip with the reason; with
OVERNIGHT_REQUIRE_POSTGRES=1 (set by .ci/run) they fail instead, so CI cannot pass by skipping.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

PG_BIN_ENV = "OVERNIGHT_PG_BIN"  # a folder holding initdb and pg_ctl (default: Debian's)
REQUIRE_ENV = "OVERNIGHT_REQUIRE_POSTGRES"
SUPERUSER = "postgres"
TEMPLATE = "overnight_template"  # migrated once; each test's database is a copy of it
START_TIMEOUT_S = 120


def find_bin() -> Path | None:
    """$OVERNIGHT_PG_BIN, else the newest /usr/lib/postgresql/<major>/bin, else initdb on PATH."""
    if os.environ.get(PG_BIN_ENV):
        return Path(os.environ[PG_BIN_ENV])
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                   else 0)
    if found:
        return found[-1].parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def why_unavailable() -> str | None:
    """None when a cluster can be started here, else the reason it cannot."""
    binaries = find_bin()
    if binaries is None or not (binaries / "initdb").exists():
        return ("PostgreSQL binaries not found (./dev.sh test installs Debian's postgresql; "
                f"or set {PG_BIN_ENV} to the folder with initdb and pg_ctl)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[postgres]')"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SUPERUSER)
        except KeyError:
            return "running as root and there is no 'postgres' user to own the cluster"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgCluster:
    """A running cluster: `url(db)` for SQLAlchemy and the CLI, `create_database`, `stop`."""

    def __init__(self, root: Path, binaries: Path, port: int) -> None:
        self.root, self.binaries, self.port = root, binaries, port
        self.data = root / "data"
        self._serial = 0

    def url(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _as_owner(self, *argv: str) -> list[str]:
        return ["runuser", "-u", SUPERUSER, "--", *argv] if os.geteuid() == 0 else list(argv)

    def _pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = self._as_owner(str(self.binaries / "pg_ctl"), "-D", str(self.data), *args)
        return subprocess.run(argv, capture_output=True, text=True, check=check,
                              timeout=START_TIMEOUT_S)

    def init(self) -> None:
        argv = self._as_owner(str(self.binaries / "initdb"), "-D", str(self.data), "-U",
                              SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync")
        subprocess.run(argv, capture_output=True, text=True, check=True,
                       timeout=START_TIMEOUT_S)

    def start(self) -> None:
        # Durability is worthless for a throw-away cluster; fsync off makes CREATE DATABASE
        # and every commit cheap on a busy shared disk.
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                   "-c max_connections=300")
        self._pg_ctl("-l", str(self.root / "server.log"), "-w", "-t", str(START_TIMEOUT_S),
                     "-o", options, "start")

    def restart(self) -> None:
        """A fast restart (every session is ended), with the options it was started with."""
        self._pg_ctl("-l", str(self.root / "server.log"), "-w", "-t", str(START_TIMEOUT_S),
                     "-m", "fast", "restart")

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def execute(self, sql: str) -> None:
        """One statement as the superuser on the maintenance database (autocommit)."""
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def create_database(self, prefix: str = "t", template: str | None = TEMPLATE) -> str:
        """A new empty (or template-copied) database; returns its URL."""
        self._serial += 1
        name = f"{prefix}_{os.getpid()}_{self._serial}"
        source = f" TEMPLATE {template}" if template else ""
        self.execute(f"CREATE DATABASE {name}{source}")
        return self.url(name)

    def drop_database(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with contextlib.suppress(Exception):
            self.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        self._pg_ctl("-m", "immediate", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster() -> PgCluster:
    """initdb + start on a free port (a port taken in between gets one more try)."""
    binaries = find_bin()
    assert binaries is not None
    # As root the server runs as `postgres`, which must reach the folder: /tmp, not a $TMPDIR
    # that may sit under root's 0700 home.
    root = Path(tempfile.mkdtemp(prefix="overnight-pg-", dir="/tmp" if os.geteuid() == 0
                                 else None))
    if os.geteuid() == 0:
        owner = pwd.getpwnam(SUPERUSER)
        os.chown(root, owner.pw_uid, owner.pw_gid)
    os.chmod(root, 0o700)
    cluster = PgCluster(root, binaries, free_port())
    try:
        cluster.init()
        for attempt in range(2):
            try:
                cluster.start()
                break
            except subprocess.CalledProcessError:
                if attempt:
                    raise
                cluster.port = free_port()
    except subprocess.CalledProcessError as exc:
        log = cluster.log()
        cluster.stop()
        raise RuntimeError(f"could not start PostgreSQL: {exc.stderr or exc.stdout}\n{log}") \
            from None
    return cluster
