"""Null changes through the real loop on a machine whose load changes: the keep rule must not
credit the machine's speed to the change.

A CPU-bound fake trainer whose metric is the work it completes in its budget
(tests/scripts/busy_trainer.py), 20 null changes, and a CPU hog switched on and off during
the sweep (tests/scripts/hog.sh: bounded, in its own session, every process killed by pid;
the kernel shares CPU between sessions and the runner gives each trainer its own, so a hog in
the test's session would barely slow the trainer). The hog is on for the baseline, so every
change run after it looks better until the incumbent runs beside it. Asserts on keeps, and
that the pairing happened; never on times: a busy machine only makes more runs.

The issue's target is at most 1 keep in 20, measured by running this file repeatedly
(benchmarks/README.md: 1 of 160 with the throughput in the summary, 1 of 200 with it only in
progress lines; before the engine's fixes 2 of 120 and 5 of 120). One pass is a draw of 20: at
the worst rate measured before those fixes (4.2 % a change) a pass keeps 2 or more about 1 time
in 5, so a bound of 1 would fail CI on a good rule. The bound here,
MAX_KEEPS, fails a good pass about 1 time in 800 at that rate (binomial, n = 20). It still
catches a rule that credits the load to the change: the issue saw such a sweep keep the first
change after every busy baseline, at z 10–80.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import make_target
from foreground import run_sweep
from null_proposer import Ideas

from agent.core.config import load_config
from agent.core.domain import ExperimentStatus, RunRole, RunStatus
from agent.git.repo import GitRepo
from agent.ops.sweeps import create_sweep

SCRIPTS = Path(__file__).parent / "scripts"
BUSY = (SCRIPTS / "busy_trainer.py").read_text()
HOG_ON_S, HOG_OFF_S = 10, 20  # hog.sh's defaults: a third of the time busy
MAX_KEEPS = 4  # of 20 null changes in one pass (see above; the target, 1, is a benchmark's)


@contextmanager
def hog(total_s: int = 600) -> Iterator[subprocess.Popen[bytes]]:
    """tests/scripts/hog.sh in its own session, on first; SIGTERM by pid at the end (its trap
    kills each hog by pid; each also dies by itself HOG_ON_S + 2 s after it started)."""
    proc = subprocess.Popen(
        ["bash", str(SCRIPTS / "hog.sh"), "--procs", "3", "--on", str(HOG_ON_S), "--off",
         str(HOG_OFF_S), "--total", str(total_s), "--start", "on"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=HOG_ON_S + HOG_OFF_S + 30)


def busy_target(dest: Path, report_steps: bool) -> Path:
    toml = textwrap.dedent("""\
        [target]
        command   = "python train.py"
        editable  = ["train.py"]
        protected = ["prepare.py", "overnight.toml"]
        metric    = "work"
        direction = "maximize"
        budget_s  = 1
        timeout_s = 60
        """)
    train = BUSY.replace("REPORT_STEPS = True", f"REPORT_STEPS = {report_steps}")
    return make_target(dest, edits={"train.py": train, "overnight.toml": toml})


@pytest.mark.slow
@pytest.mark.timeout(1500)  # a hang bound: a busy machine only makes more (and slower) runs
@pytest.mark.parametrize("report_steps", [True, False], ids=["summary", "progress-lines"])
def test_a_hog_switched_on_and_off_keeps_at_most_one_null_change(tmp_path, store, make_loop,
                                                                 report_steps):
    target = busy_target(tmp_path / "busy", report_steps)
    sweep = create_sweep(store, GitRepo(target), target, name="hog",
                         config=load_config(target), max_experiments=20)
    with hog():
        run_sweep(make_loop(target, Ideas()), sweep.name)
    changes = [e for e in store.list_experiments(sweep.id) if not e.is_baseline]
    kept = [e for e in changes if e.status is ExperimentStatus.KEPT]
    runs = store.list_runs(sweep_id=sweep.id)
    good = [r for r in runs if r.status in (RunStatus.OK, RunStatus.SUSPECT)]
    source = "summary: num_steps" if report_steps else "progress: elapsed"
    beside = [r for r in runs if r.role is RunRole.INCUMBENT and r.pair_run_id]
    print(f"hog sweep ({source}): {len(kept)} of {len(changes)} null changes kept, "
          f"{len(runs)} runs, {len(beside)} incumbent runs beside a change, "
          f"{sum(r.status is RunStatus.SUSPECT for r in runs)} suspect")
    assert len(changes) == 20 and {r.throughput_source for r in good} == {source}
    assert beside, "the load moved the throughput but no incumbent ran beside a change"
    assert len(kept) <= MAX_KEEPS, [e.reason for e in kept]
