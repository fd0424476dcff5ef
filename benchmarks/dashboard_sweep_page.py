"""Server time and size of the dashboard's sweep page with 10,000 experiments, over loopback.

Fills a fresh SQLite database with a sweep on a real git target whose experiments (and one run
each) are bulk rows (tests/bulk_seed.py: kept ~5 %, crashed ~8 %, timeouts ~2 %), starts the
real app (overnight.runtime.service_app, no scheduler) under uvicorn on an ephemeral port and
times GET /ui/sweeps/{name} with httpx: `--requests` views of an unchanged sweep (the page's
whole-sweep summary is then cached), `--changed` views each right after an experiment was added
and claimed (counts and times are read afresh; the summary stays) and as many right after it
finished (plot, evidence and digest are redrawn from the fold the finish was added to, with
the full garbage collections that ran during those views), and table pages deep in the sweep;
then the overview (`/`) and an experiment page mid-sweep, unchanged and right after a finish.
Prints p50/p90/p99/max in milliseconds and each page's size. Targets (issue 14): p50 ≤ 100 ms,
page ≤ 500 KiB.

    .venv/bin/python benchmarks/dashboard_sweep_page.py [--experiments 10000] [--requests 50]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser_helpers import make_app, serve  # noqa: E402
from bulk_seed import seed_sweep  # noqa: E402


def timed(get: Callable[[], httpx.Response], n: int, before: Callable[[], object] | None = None
          ) -> tuple[list[float], httpx.Response]:
    times, r = [], None
    for _ in range(n):
        if before is not None:
            before()
        t = time.perf_counter()
        r = get()
        times.append((time.perf_counter() - t) * 1000)
        r.raise_for_status()
    assert r is not None
    return sorted(times), r


class GcPauses:
    """Full (generation 2) garbage collections in this process (the server runs in a thread
    of it) while `on`: how many and how long."""

    def __init__(self) -> None:
        self.on, self.pauses, self._t = False, [], 0.0  # type: bool, list[float], float
        gc.callbacks.append(self._seen)

    def _seen(self, phase: str, info: dict[str, int]) -> None:
        if not self.on or info.get("generation") != 2:
            return
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.pauses.append((time.perf_counter() - self._t) * 1000)

    def text(self, views: int) -> str:
        worst = max(self.pauses, default=0.0)
        return (f"full GCs during those {views} views: {len(self.pauses)}, "
                f"{sum(self.pauses):.0f} ms in all, longest {worst:.0f} ms")


def line(what: str, times: list[float]) -> str:
    times = sorted(times)
    return (f"{what}: p50 {statistics.median(times):.1f} ms, p90 "
            f"{times[round(0.9 * (len(times) - 1))]:.1f} ms, p99 "
            f"{times[round(0.99 * (len(times) - 1))]:.1f} ms, max {times[-1]:.1f} ms over "
            f"{len(times)} requests")


def main() -> None:
    from agent.core.domain import ExperimentStatus, Finish, Proposal
    from db.engine import open_database
    from db.store import SqlStore

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", type=int, default=10_000)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--changed", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="overnight-bench-") as tmp:
        t0 = time.perf_counter()
        db = seed_sweep(Path(tmp), args.experiments, name="bench")
        print(f"filled {args.experiments:,} experiments in {time.perf_counter() - t0:.1f}s")
        store = SqlStore(open_database(db))
        n, started = iter(range(10**6)), []

        def start() -> None:  # one more experiment starts: the summary must be redrawn
            i = next(n)
            e = store.add_experiment(1, Proposal(f"bench change {i}", f"--- a/t\n+++ b/t\n"
                                                 f"@@ -1 +1 @@\n-A = 1\n+A = {i + 2}\n"))
            store.claim(e.id)
            started.append(e.id)

        def finish() -> None:  # ... and finishes: the digest too
            store.finish(started.pop(), Finish(ExperimentStatus.DISCARDED, metric=1.5,
                                               best_before=1.0))

        with serve(make_app(db)) as base, httpx.Client(base_url=base, timeout=60) as c:
            def get() -> httpx.Response:
                return c.get("/ui/sweeps/bench")

            t0 = time.perf_counter()
            get().raise_for_status()  # a fresh server folds the whole sweep once
            cold = time.perf_counter() - t0
            for _ in range(2):  # warm up: templates compiled, connections pooled
                get().raise_for_status()
            warm, r = timed(get, args.requests)
            began: list[float] = []
            finished: list[float] = []
            pauses = GcPauses()
            for _ in range(args.changed):
                began += timed(get, 1, before=start)[0]
                pauses.on = True
                finished += timed(get, 1, before=finish)[0]
                pauses.on = False
            older = c.get("/ui/sweeps/bench", params={"before": args.experiments // 2})
            deep, _ = timed(lambda: c.get("/ui/sweeps/bench",
                                          params={"before": args.experiments // 2}), 20)
            others = other_pages(c, args, start, finish)
    size = len(r.content)
    print(f"GET /ui/sweeps/bench ({args.experiments:,} experiments, {size / 1024:.0f} KiB):")
    print(f"  first view on a fresh server (the whole sweep folded): {cold * 1000:.0f} ms")
    print("  " + line("unchanged sweep", warm))
    print("  " + line("right after an experiment was queued and claimed",
                      sorted(began)))
    print("  " + line("first view right after it finished (plot, evidence, digest redrawn)",
                      sorted(finished)))
    print("    " + pauses.text(len(finished)))
    print("  " + line(f"table page deep in the sweep ({len(older.content) / 1024:.0f} KiB)",
                      deep))
    for text in others:
        print(text)


def other_pages(c: httpx.Client, args: argparse.Namespace, start: Callable[[], None],
                finish: Callable[[], None]) -> list[str]:
    """The overview and an experiment page mid-sweep: unchanged, and the first view right
    after an experiment finished (the experiment page's evidence is redrawn then)."""
    out = []
    for path in ("/", f"/ui/experiments/{args.experiments // 2}"):
        def get(path: str = path) -> httpx.Response:
            return c.get(path)

        def after_finish() -> None:
            start()
            finish()

        get().raise_for_status()
        warm, r = timed(get, args.requests)
        fresh, _ = timed(get, args.changed, before=after_finish)
        out.append(f"GET {path} ({len(r.content) / 1024:.0f} KiB):")
        out.append("  " + line("unchanged", warm))
        out.append("  " + line("first view right after an experiment finished", fresh))
    return out


if __name__ == "__main__":
    main()
