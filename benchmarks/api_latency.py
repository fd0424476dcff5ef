"""p50/p99 of `GET /experiments` (a page of 50) at 100,000 and 1,000,000 rows, real server.

For each `--rows` size: a fresh SQLite database gets that many finished experiments in one sweep
(bulk rows written with sqlite3's executemany, tests/bulk_seed.py: kept ~5 %, crashed ~8 %,
timeouts ~2 %), then `overnight serve` starts on an ephemeral loopback port and `--requests`
sequential requests per shape are timed with one keep-alive httpx client: the first page; deep
cursor pages (cursors spread from the newest row to the oldest tenth of the table); filtered
pages (sweep + status, several statuses, crash kind), first and deep; time-filtered pages
(`since` the last 24 h or 7 days, alone and with sweep + status; a window over 90 % of the
table walked with deep cursors, alone and with a crash kind). The bulk rows are created 5
minutes apart, so the windows hold 288 / 2,016 rows and most of the table. Targets (issue 14):
p99 ≤ 30 ms at 100k and ≤ 50 ms at 1M.

    .venv/bin/python benchmarks/api_latency.py [--rows 100000 1000000] [--requests 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bulk_seed import seed  # noqa: E402
from service_fixtures import ServerProcess, make_counting_target  # noqa: E402

Params = Callable[[int], dict[str, Any]]


def fill(db: Path, target: Path, rows: int) -> None:
    from agent.gitrepo import GitRepo
    from agent.sweeps import create_sweep
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


def measure(c: Any, name: str, params: Params, requests: int, rows: int) -> None:
    times = []
    for i in range(requests):
        t = time.perf_counter()
        r = c.get("/experiments", params={"limit": 50, **params(i)})
        times.append((time.perf_counter() - t) * 1000)
        assert r.status_code == 200 and len(r.json()["data"]) == 50, r.text[:300]
    print(f"GET /experiments ({name}, 50 rows of {rows:,}): p50 {statistics.median(times):.1f} "
          f"ms, p99 {pct(times, 0.99):.1f} ms, max {max(times):.1f} ms over {requests} requests",
          flush=True)


def run(rows: int, requests: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target = make_counting_target(root / "target", n_knobs=2)
        t0 = time.monotonic()
        fill(root / "o.db", target, rows)
        print(f"filled {rows:,} rows in {time.monotonic() - t0:.1f}s", flush=True)
        server = ServerProcess(root / "o.db", log=root / "server.log", slots=0).start()
        try:
            with server.client() as c:
                first = c.get("/experiments", params={"limit": 50}).json()
                assert first["count"] >= rows and len(first["data"]) == 50
                for _ in range(20):  # warm-up
                    c.get("/experiments", params={"limit": 50})
                def created(exp_id: int) -> str:
                    return str(c.get(f"/experiments/{exp_id}").json()["created_at"])

                for name, params in shapes(rows, created).items():
                    measure(c, name, params, requests, rows)
        finally:
            server.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--requests", type=int, default=300)
    args = ap.parse_args()
    for rows in args.rows:
        run(rows, args.requests)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
