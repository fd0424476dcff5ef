"""Server time of the dashboard's sweep page with 1,000 experiments, over loopback.

Fills a fresh SQLite database directly through the store (a sweep on a real git target, 1,000
finished experiments with diffs, summaries and log tails, loss points), starts the real app
(api.main.create_app, no scheduler) under uvicorn on an ephemeral port, and times
GET /ui/sweeps/{name} with httpx. Prints p50/p90/max in milliseconds.

    .venv/bin/python benchmarks/dashboard_sweep_page.py [--experiments 1000] [--requests 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser_helpers import make_app, make_target, serve  # noqa: E402

from agent.config import load_config  # noqa: E402
from agent.domain import CrashKind, ExperimentStatus, Finish, Proposal, utcnow  # noqa: E402
from agent.gitrepo import GitRepo  # noqa: E402
from agent.sweeps import create_sweep  # noqa: E402
from db.engine import open_database  # noqa: E402
from db.store import SqlStore  # noqa: E402
from runner.summary import ProgressPoint  # noqa: E402

LOG = "\n".join(f"step {i} | loss {5 / i:.4f} | elapsed {i * 0.5:.2f}s" for i in range(1, 41))


def fill(root: Path, n: int, seed: int = 1) -> str:
    target = make_target(root)
    store = SqlStore(open_database(root / "bench.db"))
    repo = GitRepo(target)
    sweep = create_sweep(
        store, repo, target, name="bench", config=load_config(target), max_experiments=n
    )
    head = repo.head(sweep.branch)
    rng = random.Random(seed)
    best = 1.3
    base = store.list_experiments(sweep.id)[0]
    store.claim(base.id)
    store.finish(base.id, Finish(ExperimentStatus.KEPT, metric=best, summary={}), keep_commit=head)
    start = utcnow() - timedelta(hours=n / 12)
    for i in range(1, n):
        diff = (
            "--- a/train.py\n+++ b/train.py\n@@ -9,3 +9,3 @@\n"
            f" from prepare import score\n-LR = 0.01\n+LR = {0.01 + i * 1e-5:.5f}\n WIDTH = 64\n"
        )
        exp = store.add_experiment(sweep.id, Proposal(f"LR tweak number {i}", diff, "knobs"))
        store.claim(exp.id)
        t0 = start + timedelta(minutes=5 * i)
        store.mark_started(
            exp.id, commit=head, ref=f"refs/overnight/bench/{exp.id}", run_started_at=t0
        )
        store.add_loss_points(exp.id, [ProgressPoint(s, 5 / s, s * 0.5) for s in range(1, 21)])
        roll = rng.random()
        common = dict(log_tail=LOG, run_started_at=t0, run_ended_at=t0 + timedelta(minutes=5))
        if roll < 0.08:
            store.finish(
                exp.id,
                Finish(ExperimentStatus.CRASHED, CrashKind.FUNDAMENTAL, "out of memory", **common),
            )
            continue
        metric = best + rng.gauss(0.004, 0.01)
        summary = {"val_bpb": metric, "training_seconds": 300.1, "peak_memory_mb": 45060.2}
        if metric < best:
            store.finish(
                exp.id,
                Finish(
                    ExperimentStatus.KEPT,
                    metric=metric,
                    best_before=best,
                    summary=summary,
                    **common,
                ),
                keep_commit=head,
            )
            best = metric
        else:
            store.finish(
                exp.id,
                Finish(
                    ExperimentStatus.DISCARDED,
                    metric=metric,
                    best_before=best,
                    summary=summary,
                    **common,
                ),
            )
    return sweep.name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="overnight-bench-") as tmp:
        t0 = time.perf_counter()
        name = fill(Path(tmp), args.experiments)
        print(f"filled {args.experiments} experiments in {time.perf_counter() - t0:.1f}s")
        with serve(make_app(Path(tmp) / "bench.db")) as base, httpx.Client(base_url=base) as c:
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
