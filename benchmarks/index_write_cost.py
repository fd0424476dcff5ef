"""What one index costs each write: CPU per `add_experiment` with and without it, on SQLite.

POST /experiments' throughput (post_rate.py) on a shared 2-core machine moves ±30 % between
runs, far more than one index; this isolates the store's insert path. Each round makes two
fresh migrated databases, drops `--index` from one, and queues `--inserts` distinct proposals
into each (one transaction per insert, as the API does), interleaved so that machine load
falls on both alike; the figures are process CPU microseconds per insert.

    .venv/bin/python benchmarks/index_write_cost.py [--index ix_experiments_created]
                                                    [--inserts 2000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from sqlalchemy import text  # noqa: E402
from test_store_contract import spec  # noqa: E402

from agent.core.domain import Proposal  # noqa: E402
from db.engine import open_database  # noqa: E402
from db.store import SqlStore  # noqa: E402


def insert_cpu_us(db: Path, inserts: int, drop: str | None) -> float:
    """CPU µs per add_experiment into a fresh database at `db` (without index `drop`)."""
    engine = open_database(db)
    try:
        if drop:
            with engine.begin() as conn:
                conn.execute(text(f'DROP INDEX "{drop}"'))
        store = SqlStore(engine)
        sweep = store.create_sweep(spec()).id
        t0 = time.process_time()
        for i in range(inserts):
            diff = f"--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-X = 1\n+X = {i + 2}\n"
            store.add_experiment(sweep, Proposal(f"X = {i + 2}", diff))
        return (time.process_time() - t0) / inserts * 1e6
    finally:
        engine.dispose()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--index", default="ix_experiments_created")
    ap.add_argument("--inserts", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    got: dict[str, list[float]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            got["without"].append(insert_cpu_us(Path(tmp) / f"a{r}.db", args.inserts,
                                                args.index))
            got["with"].append(insert_cpu_us(Path(tmp) / f"b{r}.db", args.inserts, None))
    for label, values in got.items():
        print(f"add_experiment {label} {args.index}: median {statistics.median(values):.0f} "
              f"µs CPU per insert, min {min(values):.0f} ({args.rounds} rounds of "
              f"{args.inserts})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
