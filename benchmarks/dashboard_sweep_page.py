"""Server time of the dashboard's sweep page with 1,000 experiments, over loopback.

Fills a fresh SQLite database directly through the store (a sweep on a real git target, 1,000
finished experiments with diffs, summaries and log tails, loss points), starts the real app
(overnight.runtime.service_app, no scheduler) under uvicorn on an ephemeral port, and times
GET /ui/sweeps/{name} with httpx. Prints p50/p90/max in milliseconds.

    .venv/bin/python benchmarks/dashboard_sweep_page.py [--experiments 1000] [--requests 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser_helpers import fill_direct, make_app, serve  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="overnight-bench-") as tmp:
        t0 = time.perf_counter()
        name = fill_direct(Path(tmp), args.experiments)
        print(f"filled {args.experiments} experiments in {time.perf_counter() - t0:.1f}s")
        with serve(make_app(Path(tmp) / f"{name}.db")) as base, httpx.Client(base_url=base) as c:
            for _ in range(3):  # warm up: templates compiled, connections pooled
                c.get(f"/ui/sweeps/{name}").raise_for_status()
            times = []
            for _ in range(args.requests):
                t = time.perf_counter()
                r = c.get(f"/ui/sweeps/{name}")
                times.append((time.perf_counter() - t) * 1000)
                r.raise_for_status()
            size = len(r.content)
            ov = []
            for _ in range(10):
                t = time.perf_counter()
                c.get("/").raise_for_status()
                ov.append((time.perf_counter() - t) * 1000)
    times.sort()
    print(
        f"GET /ui/sweeps/{name} ({args.experiments} experiments, {size / 1024:.0f} KiB): "
        f"p50 {statistics.median(times):.1f} ms, p90 {times[int(0.9 * (len(times) - 1))]:.1f} "
        f"ms, max {times[-1]:.1f} ms over {len(times)} requests"
    )
    print(f"GET / (overview): p50 {statistics.median(ov):.1f} ms")


if __name__ == "__main__":
    main()
