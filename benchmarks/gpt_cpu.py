"""Benchmark the GPT reference target: throughput and val_bpb of the unmodified train.py.

Usage: python benchmarks/gpt_cpu.py [BUDGET_S]   (default 60 seconds of training)

Runs `python train.py` in a temporary copy of experiments/gpt with OVERNIGHT_BUDGET_S=BUDGET_S
and reports tokens/s and val_bpb from the summary block. tokens/s counts only the timed steps:
train.py's first few steps (warm-up/compile) are not on the training clock, so total_tokens /
training_seconds would overstate throughput.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = Path(__file__).resolve().parent.parent / "experiments" / "gpt"
# train.py's untimed warm-up steps per device type (`untimed_steps = 10 if cuda else 3`).
UNTIMED_STEPS = {"cuda": 10}
UNTIMED_STEPS_OTHER = 3


def device_of(stdout: str) -> str:
    """The device type from train.py's first line (`device cpu | data ...`); 'cpu' if absent."""
    m = re.search(r"^device (\w+)", stdout, flags=re.M)
    return m.group(1) if m else "cpu"


def timed_tokens_per_s(summary: dict[str, str], device: str) -> float:
    """Tokens of the timed steps over the timed seconds (untimed warm-up steps excluded)."""
    steps = int(summary["num_steps"])
    untimed = UNTIMED_STEPS.get(device, UNTIMED_STEPS_OTHER)
    tokens_per_step = float(summary["total_tokens_M"]) * 1e6 / steps
    return (steps - untimed) * tokens_per_step / float(summary["training_seconds"])


def parse_summary(stdout: str) -> dict[str, str]:
    """The `key: value` lines after the last `---` line."""
    lines = stdout.splitlines()
    if "---" not in lines:
        return {}
    start = len(lines) - 1 - lines[::-1].index("---")
    out = {}
    for line in lines[start + 1:]:
        m = re.match(r"^(\w+):\s+(\S+)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def main() -> int:
    budget = sys.argv[1] if len(sys.argv) > 1 else "60"
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="overnight-gpt-bench-") as tmp:
        work = Path(tmp) / "gpt"
        shutil.copytree(TARGET, work, ignore=shutil.ignore_patterns("__pycache__"))
        cmd = [sys.executable, "train.py"]
        env = {**os.environ, "OVERNIGHT_BUDGET_S": budget}
        shown = f"cd {work} && OVERNIGHT_BUDGET_S={budget} {shlex.join(cmd)}"
        print(f"command: {shown}", flush=True)
        t0 = time.time()
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
        wall = time.time() - t0
    summary = parse_summary(proc.stdout)
    if proc.returncode != 0 or "val_bpb" not in summary:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        print(f"FAILED (exit {proc.returncode})")
        return 1
    device = device_of(proc.stdout)
    print(f"budget_s:         {budget}")
    print(f"device:           {device}")
    print(f"tokens_per_s:     {timed_tokens_per_s(summary, device):.0f}  (timed steps only)")
    print(f"val_bpb:          {summary['val_bpb']}")
    print(f"num_steps:        {summary['num_steps']}")
    print(f"training_seconds: {summary['training_seconds']}")
    print(f"total_seconds:    {summary['total_seconds']}  (wall incl. interpreter: {wall:.1f})")
    print(f"peak_memory_mb:   {summary['peak_memory_mb']}")
    print(f"load_avg_1m:      {load_before:.2f} before, {os.getloadavg()[0]:.2f} after "
          f"({os.cpu_count()} CPUs; other processes skew tokens/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
