"""Service overhead per experiment: seconds from one run's exit to the next run's start.

Runs a knobs sweep on the trivial fake trainer (tests/fixtures/fake_target) through the real
loop (git worktrees, subprocess runner, SQLite) and prints the median and p90 gap.

    .venv/bin/python benchmarks/loop_overhead.py [--experiments 30]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agent.core.config import load_config
from agent.engine.loop import Loop, LoopSettings
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo, init_repo
from agent.ops.sweeps import create_sweep
from agent.proposers.knobs import KnobsProposer
from db.engine import open_database
from db.reads import Reads
from db.store import SqlStore

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from foreground import run_sweep  # noqa: E402  (tests/: one sweep in the foreground)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiments", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "target"
        shutil.copytree(ROOT / "tests/fixtures/fake_target", target)
        # Extra no-op constants so the knobs proposer has enough ideas for a long sweep.
        extra = "".join(f"EXTRA_{i} = 1.0\n" for i in range(12))
        train = target / "train.py"
        train.write_text(train.read_text().replace("SLEEP_S = 0.0", extra + "SLEEP_S = 0.0"))
        init_repo(target)
        store = SqlStore(open_database(Path(tmp) / "o.db"))
        sweep = create_sweep(
            store,
            GitRepo(target),
            target,
            name="bench",
            config=load_config(target),
            max_experiments=args.experiments,
        )
        loop = Loop(
            store,
            GitRepo(target),
            SubprocessRunner(),
            LoopSettings(Path(tmp) / "work"),
            proposer=KnobsProposer(),
        )
        t0 = time.perf_counter()
        run_sweep(loop, sweep.name)
        wall = time.perf_counter() - t0
        times = [t for t in Reads(store).timestamps(sweep.id) if t[0] and t[1]]
        gaps = sorted((b[0] - a[1]).total_seconds() for a, b in zip(times, times[1:], strict=False))
        runs = [(b - a).total_seconds() for a, b in times]
    print(f"experiments run: {len(times)} in {wall:.1f}s wall")
    print(f"run time (spawn to exit, trivial trainer): median {statistics.median(runs):.3f}s")
    print(
        f"overhead exit->next start: median {statistics.median(gaps) * 1000:.0f} ms, "
        f"p90 {gaps[int(0.9 * (len(gaps) - 1))] * 1000:.0f} ms, max {gaps[-1] * 1000:.0f} ms"
    )
    print(f"command: .venv/bin/python benchmarks/loop_overhead.py --experiments {args.experiments}")


if __name__ == "__main__":
    main()
