"""The demo's changes on a budget of steps: val_bpb of the gpt target and of each change the
demo tries there (agent.ops.demo.STEP_CHANGES), over seeds, and the wall time of a run at one
thread against all of them. What the demo's step count and its chosen changes rest on.

Usage: python benchmarks/demo_changes.py [--steps 20] [--seeds 3] [--threads 1,2]

Each run is `python train.py` in a temporary copy of experiments/gpt with
OVERNIGHT_BUDGET_STEPS and OMP_NUM_THREADS set (the first --threads value for the changes; the
others run the baseline only, to compare). Prints per change: the mean val_bpb ± sd of its runs,
its difference from the baseline's mean in baseline sds, and the mean wall seconds of a run;
with the load average before and after (other processes slow every run alike).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.ops.demo import BUSY_STEPS, STEP_CHANGES  # noqa: E402
from agent.proposers.knobs import knob_proposal  # noqa: E402
from benchmarks.gpt_cpu import parse_summary  # noqa: E402

TARGET = ROOT / "experiments" / "gpt"


def runs(work: Path, steps: int, seeds: int, threads: int) -> list[tuple[float, float]]:
    """(val_bpb, wall seconds) of each seed's run in `work`."""
    out = []
    for seed in range(42, 42 + seeds):
        env = {**os.environ, "OVERNIGHT_BUDGET_STEPS": str(steps), "OVERNIGHT_SEED": str(seed),
               "OVERNIGHT_DEVICE": "cpu", "OMP_NUM_THREADS": str(threads)}
        t0 = time.time()
        proc = subprocess.run([sys.executable, "train.py"], cwd=work, env=env,
                              capture_output=True, text=True, check=False)
        summary = parse_summary(proc.stdout)
        if "val_bpb" not in summary:
            sys.exit(f"{work.name} seed {seed} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        out.append((float(summary["val_bpb"]), time.time() - t0))
    return out


def copy_with(tmp: Path, name: str, change: tuple[str, str] | None) -> Path:
    work = tmp / name
    shutil.copytree(TARGET, work, ignore=shutil.ignore_patterns("__pycache__"))
    if change is not None:
        text = (work / "train.py").read_text()
        diff = knob_proposal({"train.py": text}, (change,)).diff
        subprocess.run(["git", "apply", "-"], cwd=work, input=diff, text=True, check=True)
    return work


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=BUSY_STEPS)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--threads", default="1")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; "
          f"{args.steps} steps, {args.seeds} seeds")
    with tempfile.TemporaryDirectory(prefix="overnight-demo-bench-") as tmp:
        base = runs(copy_with(Path(tmp), "baseline", None), args.steps, args.seeds, threads[0])
        mean, sd = statistics.fmean(v for v, _ in base), statistics.stdev(v for v, _ in base)
        print(f"baseline ({threads[0]} thread(s)): {mean:.4f} ± {sd:.4f}, "
              f"{statistics.fmean(w for _, w in base):.1f} s a run")
        for n in threads[1:]:
            other = runs(copy_with(Path(tmp), f"baseline-{n}", None), args.steps, args.seeds, n)
            print(f"baseline ({n} thread(s)): {statistics.fmean(w for _, w in other):.1f} s a run")
        for name, value in STEP_CHANGES:
            got = runs(copy_with(Path(tmp), f"{name}-{value}", (name, value)), args.steps,
                       args.seeds, threads[0])
            m = statistics.fmean(v for v, _ in got)
            print(f"{name} -> {value}: {m:.4f} ± {statistics.stdev(v for v, _ in got):.4f} "
                  f"({(m - mean) / sd:+.1f} baseline sd), "
                  f"{statistics.fmean(w for _, w in got):.1f} s a run")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
