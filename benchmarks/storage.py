"""Bytes stored per experiment before and after `overnight gc` (issue 14 part 4).

Seeds `--nights` recorded nights of `--experiments` each (real rows through the Store in a
real SQLite file, a log of `--steps` progress lines per run where the engine writes logs, as
many loss points, a hidden git ref per change, two leftover worktrees a night), one night per
day up to today, then runs the real `overnight gc --older-than 2d --json` and prints the bytes
per experiment (database, logs, worktrees) before and after, with the database's tables.

    .venv/bin/python benchmarks/storage.py [--nights 7] [--experiments 100] [--steps 1000]
                                           [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from service_fixtures import make_counting_target  # noqa: E402
from storage_fixtures import seed_night  # noqa: E402

OVERNIGHT = str(Path(sys.executable).with_name("overnight"))


def seed(tmp: Path, nights: int, experiments: int, steps: int) -> Path:
    from db.engine import open_database
    from db.store import SqlStore

    db = tmp / "o.db"
    store = SqlStore(open_database(db))
    for night in range(nights):
        target = make_counting_target(tmp / f"target{night}", n_knobs=experiments)
        seed_night(store, target, tmp / "o.db.work", sweep=f"night{night}",
                   experiments=experiments, steps=steps, leftover_worktrees=2,
                   age=timedelta(days=nights - 1 - night, hours=6), seed=night)
    store.engine.dispose()
    return db


def measure(nights: int, experiments: int, steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        db = seed(Path(tmp), nights, experiments, steps)
        done = subprocess.run([OVERNIGHT, "gc", "--db", str(db), "--older-than", "2d",
                               "--json"], capture_output=True, text=True, check=True)
        return dict(json.loads(done.stdout))


def _line(label: str, s: dict[str, Any]) -> str:
    kib = 1024
    tables = ", ".join(f"{k} {v / kib:.0f} KiB" for k, v in sorted(
        s["tables"].items(), key=lambda kv: -kv[1]) if v >= kib)
    return (f"{label}: {s['experiments']} experiments, {s['bytes_per_experiment'] / kib:.1f} KiB "
            f"each (database {s['database_bytes'] / kib:.0f} KiB [{tables}], logs "
            f"{s['log_bytes'] / kib:.0f} KiB, worktrees {s['worktree_bytes'] / kib:.0f} KiB)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nights", type=int, default=7)
    ap.add_argument("--experiments", type=int, default=100)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = measure(args.nights, args.experiments, args.steps)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    g = r["gc"]
    print(_line("before gc", r["before"]))
    print(f"gc --older-than 2d: {g['experiments']} experiments pruned, {g['log_files']} log "
          f"files ({g['log_bytes'] / 1024:.0f} KiB), {g['loss_points_removed']} loss points, "
          f"{g['worktrees']} worktrees; {r['vacuum']}")
    print(_line("after gc", r["after"]))
    return 0 if r["after"]["bytes_per_experiment"] < r["before"]["bytes_per_experiment"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
