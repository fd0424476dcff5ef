"""A year of nights in one database: what the surfaces that list sweeps cost.

One GPU box running every night for a year leaves ~365 sweeps of ~110 experiments each (~40,000
rows, one run each). This fills a fresh SQLite database with that (tests/bulk_seed.py, one
night a day; all but the last night `done`), then times, over loopback on the real app
(overnight.runtime.service_app, no scheduler) and in-process:

- `overnight status` (a real subprocess: the latest 30 sweeps, and `--all`);
- GET /sweeps, the dashboard overview (/), GET /experiments' first page (all sweeps, and
  `status=kept`), a sweep page of an old night;
- the engine's pick: `Store.list_sweeps([RUNNING])` (what a slot reads every time it looks for
  work) beside `Store.list_sweeps()` (every sweep);
- `overnight gc --older-than 2d`, the first on the year and the next (a subprocess).

Prints p50/max in milliseconds (status: wall seconds) and each page's size.

    .venv/bin/python benchmarks/year_of_nights.py [--nights 365] [--per-night 110]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser_helpers import make_app, serve  # noqa: E402
from bulk_seed import seed  # noqa: E402


def fill(db: Path, nights: int, per_night: int) -> None:
    """`nights` sweeps of `per_night` finished experiments, one night a day; the last running."""
    import sqlite3

    from agent.core.config import TargetConfig
    from agent.core.domain import utcnow
    from agent.core.ports import SweepSpec
    from db.engine import open_database
    from db.store import SqlStore

    config = TargetConfig.from_dict({"command": "python train.py", "editable": ["train.py"],
                                     "protected": ["prepare.py"], "metric": "val_bpb",
                                     "budget_s": 300})
    engine = open_database(db)
    store = SqlStore(engine)
    first = utcnow() - timedelta(days=nights + 1)
    for night in range(nights):
        sweep = store.create_sweep(SweepSpec(
            name=f"night-{night:03d}", target_path="/srv/target", branch=f"overnight/n{night}",
            proposer="knobs", config=config, protected_hashes={}))
        seed(db, sweep.id, per_night, rng_seed=night, runs=True,
             start=first + timedelta(days=night))
    engine.dispose()
    con = sqlite3.connect(db)
    con.execute("UPDATE sweeps SET status = 'done' WHERE id < (SELECT max(id) FROM sweeps)")
    con.commit()
    con.close()


def timed(call: Callable[[], object], n: int) -> tuple[list[float], object]:
    call()  # warm: templates compiled, connections pooled
    times, out = [], None
    for _ in range(n):
        t = time.perf_counter()
        out = call()
        times.append((time.perf_counter() - t) * 1000)
    return times, out


def line(what: str, times: list[float], size: int | None = None) -> str:
    kib = f", {size / 1024:.0f} KiB" if size is not None else ""
    return f"  {what}: p50 {statistics.median(times):.1f} ms, max {max(times):.1f} ms{kib}"


def cli_seconds(db: Path, *args: str) -> float:
    """Wall seconds of `overnight ARGS --db DB` (a real subprocess)."""
    exe = Path(sys.executable).parent / "overnight"
    t = time.perf_counter()
    subprocess.run([str(exe), *args, "--db", str(db)], check=True,
                   capture_output=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    return time.perf_counter() - t


def main() -> None:
    from agent.core.domain import SweepStatus
    from db.engine import open_database
    from db.store import SqlStore

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nights", type=int, default=365)
    ap.add_argument("--per-night", type=int, default=110)
    ap.add_argument("--requests", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="overnight-bench-") as tmp:
        db = Path(tmp) / "year.db"
        t0 = time.perf_counter()
        fill(db, args.nights, args.per_night)
        print(f"filled {args.nights} nights × {args.per_night} experiments in "
              f"{time.perf_counter() - t0:.0f} s")
        print(f"overnight status: {cli_seconds(db, 'status'):.2f} s (latest 30), "
              f"{cli_seconds(db, 'status', '--all'):.2f} s (--all); wall, process start "
              "included")
        old = f"night-{args.nights // 2:03d}"
        with serve(make_app(db)) as base, httpx.Client(base_url=base, timeout=60) as c:
            for path in ("/sweeps", "/", "/experiments?limit=50",
                         "/experiments?status=kept&limit=50", f"/ui/sweeps/{old}"):
                times, r = timed(partial(c.get, path), args.requests)
                assert isinstance(r, httpx.Response) and r.status_code == 200, path
                print(line(f"GET {path}", times, len(r.content)))
        store = SqlStore(open_database(db))
        print("the engine's pick reads the open sweeps:")
        print(line("list_sweeps([RUNNING])",
                   timed(lambda: store.list_sweeps([SweepStatus.RUNNING]), args.requests)[0]))
        print(line("list_sweeps() (every sweep)",
                   timed(store.list_sweeps, args.requests)[0]))
        print(f"overnight gc --older-than 2d, the first on a year (every night but the last "
              f"two pruned): {cli_seconds(db, 'gc', '--older-than', '2d'):.1f} s; "
              f"the next: {cli_seconds(db, 'gc', '--older-than', '2d'):.1f} s")


if __name__ == "__main__":
    main()
