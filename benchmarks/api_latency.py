"""p50/p99 of `GET /experiments` (a page of 50) with 10,000 rows, on loopback, real server.

Fills a fresh database with `--rows` finished experiments (bulk insert through the ORM), starts
`overnight serve` on an ephemeral loopback port and times `--requests` sequential requests
with one keep-alive httpx client: first pages, cursor pages deep in the table, and a filtered
query (sweep + status).

    .venv/bin/python benchmarks/api_latency.py [--rows 10000] [--requests 500]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from service_fixtures import ServerProcess, make_counting_target  # noqa: E402


def fill(db: Path, target: Path, rows: int) -> None:
    from agent.domain import utcnow
    from agent.gitrepo import GitRepo
    from agent.sweeps import create_sweep
    from db.engine import open_database
    from db.models import ExperimentRow
    from db.store import SqlStore

    engine = open_database(db)
    store = SqlStore(engine)
    sweep = create_sweep(store, GitRepo(target), target, name="big", proposer="queue")
    rng = random.Random(0)
    now = utcnow()
    with store.session("bulk insert") as s:
        for i in range(rows):
            status = rng.choice(["kept", "discarded", "discarded", "crashed"])
            s.add(ExperimentRow(
                sweep_id=sweep.id, proposer="knobs", description=f"LR x{i}",
                diff=f"--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-LR = 1\n+LR = {i}\n",
                status=status, crash_kind="fundamental" if status == "crashed" else None,
                metric=None if status == "crashed" else 1.0 + rng.random(),
                best_before=1.0, summary={"val_bpb": 1.0, "peak_memory_mb": 2048.0},
                meta={}, created_at=now, started_at=now, finished_at=now,
                log_path=f"/tmp/logs/{i}.log"))
    engine.dispose()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--requests", type=int, default=500)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target = make_counting_target(root / "target", n_knobs=2)
        t0 = time.monotonic()
        fill(root / "o.db", target, args.rows)
        print(f"filled {args.rows} rows in {time.monotonic() - t0:.1f}s")
        server = ServerProcess(root / "o.db", log=root / "server.log", slots=0).start()
        try:
            with server.client() as c:
                first = c.get("/experiments", params={"limit": 50}).json()
                assert first["count"] >= args.rows and len(first["data"]) == 50
                cursors = [first["next_cursor"]]
                page = first
                for _ in range(20):  # cursors spread through the table
                    page = c.get("/experiments", params={"limit": 50,
                                                         "cursor": page["next_cursor"]}).json()
                    cursors.append(page["next_cursor"])
                cursors.append(args.rows // 2)
                shapes = {
                    "first page": lambda i: {"limit": 50},
                    "cursor page": lambda i: {"limit": 50, "cursor": cursors[i % len(cursors)]},
                    "sweep+status": lambda i: {"limit": 50, "sweep": "big", "status": "kept"},
                }
                for _ in range(20):  # warm-up
                    c.get("/experiments", params={"limit": 50})
                for name, params in shapes.items():
                    times = []
                    for i in range(args.requests):
                        t = time.perf_counter()
                        r = c.get("/experiments", params=params(i))
                        times.append((time.perf_counter() - t) * 1000)
                        assert r.status_code == 200 and len(r.json()["data"]) == 50
                    print(f"GET /experiments ({name}, 50 rows of {args.rows}): "
                          f"p50 {statistics.median(times):.1f} ms, p99 {pct(times, 0.99):.1f} ms,"
                          f" max {max(times):.1f} ms over {args.requests} requests")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
