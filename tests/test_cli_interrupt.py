"""Ctrl-C and SIGTERM during a foreground `overnight run` (a real subprocess) mid-baseline: the
run is recorded `interrupted`, the command says how to resume, and `--resume` reruns the
baseline before anything is judged against it. `results` copes with a sweep with no metric."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES, make_target
from service_fixtures import wait_for

from agent.core.domain import Experiment, ExperimentStatus, Proposal
from db.engine import open_database
from db.store import SqlStore
from runner.groups import process_group_alive

OVERNIGHT = str(Path(sys.executable).parent / "overnight")


def _held_target(tmp_path: Path) -> tuple[Path, Path]:
    """The fake trainer, made to wait (silently, after its first step) while `hold` exists."""
    hold = tmp_path / "hold"
    hold.touch()
    text = (FIXTURES / "fake_target" / "train.py").read_text().replace(
        "value = score(LR, WIDTH, USE_TRICK)",
        f"while os.path.exists({str(hold)!r}) and time.time() - start < 300:\n"
        "    time.sleep(0.05)\nvalue = score(LR, WIDTH, USE_TRICK)")
    # The hold, not the run's limit, decides when the trainer ends: on a busy machine the
    # signal may come long after the first step.
    toml = (FIXTURES / "fake_target" / "overnight.toml").read_text()
    assert "timeout_s = 20" in toml
    toml = toml.replace("timeout_s = 20", "timeout_s = 600")
    return make_target(tmp_path / "t", edits={"train.py": text, "overnight.toml": toml}), hold


def _rows(store: SqlStore) -> list[Experiment]:
    return store.list_experiments(store.get_sweep("night").id) if store.list_sweeps() else []


def _env() -> dict[str, str]:
    # PYTHONFAULTHANDLER: a run that does not end can be asked (SIGABRT) where its threads are.
    return {**os.environ, "COLUMNS": "200", "PYTHONFAULTHANDLER": "1"}


def _ended(proc: subprocess.Popen[str], after: str, timeout_s: float = 120) -> tuple[str, str]:
    """The process's output once it exits; if it has not `timeout_s` after `after`, the test
    fails with where its threads were (faulthandler's dump on SIGABRT) and what it printed."""
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"still running {timeout_s:.0f} s after {after}; stdout:\n{out[-2000:]}\n"
                    f"stderr with every thread's stack:\n{err[-12000:]}")


@pytest.mark.timeout(900)  # a hang bound: a busy machine only makes it slower
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_baseline_is_an_interruption_and_resume_reruns_the_baseline(
        tmp_path: Path, sig: signal.Signals, code: int) -> None:
    target, hold = _held_target(tmp_path)
    db = tmp_path / "o.db"
    argv = [OVERNIGHT, "run", "--target", str(target), "--experiments", "2", "--sweep", "night",
            "--db", str(db)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())
    # The baseline's log (experiment 1 of a new database), read before this test opens the
    # database itself: the CLI creates and migrates it without a second process in the way.
    log = Path(f"{db}.work") / "logs" / "night" / "1.log"

    def baseline_training() -> bool:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"`overnight run` ended ({proc.returncode}) before its baseline trained:"
                        f"\n{out[-2000:]}\n{err[-4000:]}")
        return log.is_file() and "step 1" in log.read_text()

    wait_for(baseline_training, 240, "the baseline to start training")  # a hang bound
    store = SqlStore(open_database(db))
    running = _rows(store)[0]
    assert running.is_baseline and running.status is ExperimentStatus.RUNNING, running
    proc.send_signal(sig)
    out, err = _ended(proc, sig.name)
    assert proc.returncode == code, out + err
    baseline = store.get_experiment(running.id)
    assert baseline.status is ExperimentStatus.INTERRUPTED, baseline
    assert baseline.reason and baseline.reason.startswith(f"interrupted by {sig.name}")
    assert "KeyboardInterrupt" not in baseline.reason and "Traceback" not in err
    assert running.pgid and not process_group_alive(running.pgid)
    resume = shlex.join([OVERNIGHT.rsplit("/", 1)[-1], "run", "--target", str(target),
                         "--sweep", "night", "--resume", "--db", str(db)])
    assert f"resume with: {resume}" in err and "Sweep night is paused" in err
    assert store.get_sweep("night").status.value == "paused"

    hold.unlink()  # from now on the trainer finishes at once
    again = subprocess.run([OVERNIGHT, *shlex.split(resume)[1:]], capture_output=True, text=True,
                           timeout=300, env=_env())
    assert again.returncode == 0, again.stdout + again.stderr
    rows = _rows(store)
    baselines = [e for e in rows if e.is_baseline]
    assert [e.status for e in baselines] == [ExperimentStatus.INTERRUPTED, ExperimentStatus.KEPT]
    sweep = store.get_sweep("night")
    assert sweep.baseline_metric is not None and sweep.best_metric is not None
    first_change = next(e for e in rows if not e.is_baseline)
    assert first_change.id > baselines[1].id  # judged only after the baseline's metric
    assert first_change.best_before == pytest.approx(sweep.baseline_metric)


def test_results_and_status_cope_with_a_sweep_without_a_baseline_metric(tmp_path: Path) -> None:
    """The state an old interrupted baseline left: a best metric, no baseline metric."""
    target = make_target(tmp_path / "t")
    db = tmp_path / "o.db"
    subprocess.run([OVERNIGHT, "run", "--target", str(target), "--experiments", "1",
                    "--sweep", "night", "--db", str(db)], check=True, capture_output=True,
                   timeout=300, env=_env())
    store = SqlStore(open_database(db))
    sweep = store.get_sweep("night")
    from sqlalchemy import text

    with store.engine.begin() as conn:  # as the old bug left it
        conn.execute(text("UPDATE sweeps SET baseline_metric = NULL"))
    exp = store.add_experiment(sweep.id, Proposal("x", "", "external"))
    assert exp.metric is None
    for args in (["results", "--sweep", "night"], ["results", "--sweep", "night", "--format",
                                                   "tsv"], ["status"]):
        done = subprocess.run([OVERNIGHT, *args, "--db", str(db)], capture_output=True,
                              text=True, timeout=120, env=_env())
        assert done.returncode == 0, done.stdout + done.stderr
    table = subprocess.run([OVERNIGHT, "results", "--sweep", "night", "--db", str(db)],
                           capture_output=True, text=True, timeout=120, env=_env()).stdout
    assert re.search(r"no baseline metric: \d+ change\(s\) tried, nothing compared", table)
