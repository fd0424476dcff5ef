"""What one keep decision reads of a long sweep: the sweep's runs, as whole records
(Store.list_runs) and as the keep rule reads them (Store.run_metrics: what the loop reads at each
decision and incumbent check), median of --repeat reads per size.

A sweep of `--runs` finished experiments with one run each is written as bulk rows
(tests/bulk_seed.py) into a fresh SQLite file on a real git target.

    .venv/bin/python benchmarks/decision_reads.py [--runs 1000 10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bulk_seed import seed_sweep  # noqa: E402

from db.engine import open_database  # noqa: E402
from db.store import SqlStore  # noqa: E402


def median_ms(read: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        read()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def measure(tmp: Path, n: int, repeat: int) -> tuple[float, float]:
    store = SqlStore(open_database(seed_sweep(tmp, n)))
    sweep_id = store.get_sweep("big").id
    try:
        return (median_ms(lambda: store.list_runs(sweep_id=sweep_id), repeat),
                median_ms(lambda: store.run_metrics(sweep_id), repeat))
    finally:
        store.engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, nargs="+", default=[1000, 10_000])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print("runs in the sweep  list_runs ms  run_metrics ms")
    for n in args.runs:
        with tempfile.TemporaryDirectory() as tmp:
            whole, samples = measure(Path(tmp), n, args.repeat)
        print(f"{n:>17}  {whole:>12.1f}  {samples:>14.1f}")
    print("command: .venv/bin/python benchmarks/decision_reads.py --runs "
          + " ".join(map(str, args.runs)) + f" --repeat {args.repeat}")


if __name__ == "__main__":
    main()
