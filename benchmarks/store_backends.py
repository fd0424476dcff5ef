"""The store on SQLite and on PostgreSQL, side by side: queueing, concurrent claims, pages.

Starts a throw-away PostgreSQL cluster the way the tests do (tests/pg_server.py: Debian's
initdb/pg_ctl, a temp dir, a loopback port, fsync off like a test server — so these are
figures of the code path, not of durable commits). For each backend:

- queue: `add_experiment` one transaction each (the duplicate check is the insert) → rows/s;
- claim: N threads `claim_next` until the queue is empty → claims/s, and the check that no
  experiment was claimed twice;
- page: `list_experiments(newest_first, limit=50)` and the same filtered by sweep and status,
  p50/p99 over the requests.

    .venv/bin/python benchmarks/store_backends.py --rows 5000 --threads 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from agent.core.config import TargetConfig  # noqa: E402
from agent.core.domain import ExperimentStatus, Proposal  # noqa: E402
from agent.core.ports import SweepSpec  # noqa: E402
from db.engine import open_database  # noqa: E402
from db.store import SqlStore  # noqa: E402

CONFIG = TargetConfig(command="python train.py", editable=("train.py",), metric="val_bpb",
                      budget_s=1, timeout_s=5)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(store: SqlStore, rows: int, threads: int, requests: int) -> dict[str, float]:
    sweeps = [store.create_sweep(SweepSpec(name=f"s{i}", target_path="/t", proposer="queue",
                                           branch=f"overnight/s{i}", config=CONFIG)).id
              for i in range(4)]
    t0 = time.perf_counter()
    for k in range(rows):
        store.add_experiment(sweeps[k % 4], Proposal(f"e{k}", f"diff {k}"), priority=k % 3)
    queue_s = time.perf_counter() - t0
    won: list[int] = []
    lock = threading.Lock()

    def claimer() -> None:
        while (exp := store.claim_next()) is not None:
            with lock:
                won.append(exp.id)

    pool = [threading.Thread(target=claimer) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    claim_s = time.perf_counter() - t0
    assert len(won) == rows == len(set(won)), "an experiment was claimed twice or never"
    first, filtered = [], []
    for _ in range(requests):
        t0 = time.perf_counter()
        store.list_experiments(newest_first=True, limit=50)
        first.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        store.list_experiments(sweeps[1], [ExperimentStatus.RUNNING], newest_first=True,
                               limit=50)
        filtered.append(time.perf_counter() - t0)
    return {"queue_per_s": rows / queue_s, "claims_per_s": rows / claim_s,
            "page_p50_ms": statistics.median(first) * 1000, "page_p99_ms": pct(first, 0.99) * 1000,
            "filtered_p50_ms": statistics.median(filtered) * 1000,
            "filtered_p99_ms": pct(filtered, 0.99) * 1000}


def main() -> None:
    import pg_server

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--requests", type=int, default=300)
    args = ap.parse_args()
    reason = pg_server.why_unavailable()
    if reason:
        sys.exit(f"cannot start PostgreSQL: {reason}")
    cluster = pg_server.start_cluster()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            backends = {"sqlite": str(Path(tmp) / "o.db"),
                        "postgresql": cluster.create_database("bench", template=None)}
            for name, where in backends.items():
                engine = open_database(where)
                try:
                    got = measure(SqlStore(engine), args.rows, args.threads, args.requests)
                finally:
                    engine.dispose()
                print(f"{name:10} queue {got['queue_per_s']:6.0f}/s  claims ({args.threads} "
                      f"threads) {got['claims_per_s']:6.0f}/s  page p50 "
                      f"{got['page_p50_ms']:.1f} ms p99 {got['page_p99_ms']:.1f} ms  "
                      f"sweep+status p50 {got['filtered_p50_ms']:.1f} ms "
                      f"p99 {got['filtered_p99_ms']:.1f} ms", flush=True)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
