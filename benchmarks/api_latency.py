"""p50/p99 of `GET /experiments` (a page of 50) at 100,000 and 1,000,000 rows, real server,
on SQLite and (with `--backend postgres`) on PostgreSQL.

For each `--rows` size and backend: a fresh database gets that many finished experiments in one
sweep (bulk rows, tests/bulk_seed.py: sqlite3's executemany, or COPY FROM STDIN then ANALYZE on
PostgreSQL; kept ~5 %, crashed ~8 %, timeouts ~2 %), then `overnight serve --db <file or URL>`
starts on an ephemeral loopback port and `--requests` sequential requests per shape are timed
with one keep-alive httpx client (and the server process's CPU per request is read from /proc:
less swayed by a busy machine than the latencies): the first page; deep cursor pages (cursors
spread from the newest row to the oldest tenth of the table); filtered pages (sweep + status,
several statuses, crash kind), first and deep; time-filtered pages (`since` the last 24 h or 7
days, alone and with sweep + status; a window over 90 % of the table walked with deep cursors,
alone and with a crash kind). The bulk rows are created 5 minutes apart, so the windows hold
288 / 2,016 rows and most of the table. PostgreSQL is a throw-away cluster started the way the
tests do (tests/pg_server.py: Debian's initdb/pg_ctl, a temp dir, loopback, fsync off). Targets
(issue 14, SQLite): p99 ≤ 30 ms at 100k and ≤ 50 ms at 1M.

    .venv/bin/python benchmarks/api_latency.py [--rows 100000 1000000] [--requests 300]
        [--backend sqlite postgres]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bulk_seed import seed  # noqa: E402
from post_rate import cpu_s  # noqa: E402  (this folder is on the path when run as a script)
from service_fixtures import ServerProcess, make_counting_target  # noqa: E402

BACKENDS = ("sqlite", "postgres")
Params = Callable[[int], dict[str, Any]]


def fill(db: str, target: Path, rows: int) -> None:
    from agent.git.repo import GitRepo
    from agent.ops.sweeps import create_sweep
    from db.engine import open_database
    from db.store import SqlStore

    engine = open_database(db)
    sweep = create_sweep(SqlStore(engine), GitRepo(target), target, name="big", proposer="queue")
    engine.dispose()
    seed(db, sweep.id, rows)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def shapes(rows: int, created: Callable[[int], str]) -> dict[str, Params]:
    """The request shapes; `created(id)` is that row's created_at (for the time windows)."""
    deep = [rows - k * rows // 20 for k in range(19)]  # from the newest to the oldest tenth
    kept = {"sweep": "big", "status": "kept"}
    crashes = {"status": ["crashed", "timeout"]}
    day, week = ({"since": created(rows - n)} for n in (288, 2016))
    span = {"since": created(rows // 20), "until": created(rows - rows // 20)}
    inside = [c for c in deep if rows // 10 <= c <= rows - rows // 10]
    return {
        "first page": lambda i: {},
        "deep cursor page": lambda i: {"cursor": deep[i % len(deep)]},
        "sweep+status, first": lambda i: kept,
        "sweep+status, deep": lambda i: {**kept, "cursor": deep[i % len(deep)]},
        "crashed+timeout, deep": lambda i: {**crashes, "cursor": deep[i % len(deep)]},
        "crash kind, deep": lambda i: {"crash_kind": "fundamental",
                                       "cursor": deep[i % len(deep)]},
        "since 24 h, first": lambda i: day,
        "sweep+status since 7 d, first": lambda i: {**kept, **week},
        "90 % window, deep": lambda i: {**span, "cursor": inside[i % len(inside)]},
        "crash kind in 90 % window, deep": lambda i: {**span, "crash_kind": "fundamental",
                                                      "cursor": inside[i % len(inside)]},
    }


def measure(c: Any, name: str, params: Params, requests: int, rows: int,
            backend: str, pid: int) -> tuple[float, float, float]:
    times = []
    cpu0 = cpu_s(pid)
    for i in range(requests):
        t = time.perf_counter()
        r = c.get("/experiments", params={"limit": 50, **params(i)})
        times.append((time.perf_counter() - t) * 1000)
        assert r.status_code == 200 and len(r.json()["data"]) == 50, r.text[:300]
    cpu_ms = (cpu_s(pid) - cpu0) * 1000 / requests
    p50, p99 = statistics.median(times), pct(times, 0.99)
    print(f"{backend:8}  GET /experiments ({name}, 50 rows of {rows:,}): p50 {p50:.1f} ms, "
          f"p99 {p99:.1f} ms, max {max(times):.1f} ms over {requests} requests; server CPU "
          f"{cpu_ms:.2f} ms per request", flush=True)
    return p50, p99, cpu_ms


# (backend, rows, shape) -> p50, p99, the server process's CPU ms per request
Result = dict[tuple[str, int, str], tuple[float, float, float]]


@contextlib.contextmanager
def database(backend: str, root: Path, cluster: Any) -> Iterator[str]:
    """A fresh database for one run (`fill` migrates it): a file in `root`, or an empty
    database on the cluster, dropped afterwards."""
    if backend == "sqlite":
        yield str(root / "o.db")
        return
    url = cluster.create_database("bench", template=None)
    try:
        yield url
    finally:
        cluster.drop_database(url)


def run(rows: int, requests: int, backend: str, cluster: Any, results: Result) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target = make_counting_target(root / "target", n_knobs=2)
        with database(backend, root, cluster) as db:
            t0 = time.monotonic()
            fill(db, target, rows)
            print(f"{backend:8}  filled {rows:,} rows in {time.monotonic() - t0:.1f}s",
                  flush=True)
            server = ServerProcess(db, log=root / "server.log", slots=0,
                                   extra=["--work-dir", str(root / "work")]).start()
            try:
                assert server.proc is not None
                with server.client() as c:
                    measure_all(c, rows, requests, backend, results, server.proc.pid)
            finally:
                server.stop()


def measure_all(c: Any, rows: int, requests: int, backend: str, results: Result,
                pid: int) -> None:
    first = c.get("/experiments", params={"limit": 50}).json()
    assert first["count"] >= rows and len(first["data"]) == 50
    for _ in range(20):  # warm-up
        c.get("/experiments", params={"limit": 50})

    def created(exp_id: int) -> str:
        return str(c.get(f"/experiments/{exp_id}").json()["created_at"])

    for name, params in shapes(rows, created).items():
        results[backend, rows, name] = measure(c, name, params, requests, rows, backend, pid)


@contextlib.contextmanager
def postgres_cluster(wanted: bool) -> Iterator[Any]:
    """A throw-away cluster (tests/pg_server.py) when PostgreSQL is measured, else None."""
    if not wanted:
        yield None
        return
    import pg_server

    reason = pg_server.why_unavailable()
    if reason:
        sys.exit(f"cannot start PostgreSQL: {reason}")
    cluster = pg_server.start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


def report(results: Result, args: argparse.Namespace) -> None:
    print("\nbackend   rows       shape                            p50 ms   p99 ms   CPU ms")
    for (backend, rows, name), (p50, p99, cpu) in results.items():
        print(f"{backend:8}  {rows:>9,}  {name:31}  {p50:7.1f}  {p99:7.1f}  {cpu:7.2f}")
    print("command: .venv/bin/python benchmarks/api_latency.py " + " ".join(
        ["--rows", *map(str, args.rows), "--requests", str(args.requests),
         "--backend", *args.backend]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--backend", nargs="+", choices=BACKENDS, default=["sqlite"])
    args = ap.parse_args()
    results: Result = {}
    with postgres_cluster("postgres" in args.backend) as cluster:
        for rows in args.rows:
            for backend in args.backend:
                run(rows, args.requests, backend, cluster, results)
    report(results, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
