"""run_command against real child processes: planted scripts, 1-3 second budgets."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runner import (
    Outcome,
    RunResult,
    kill_process_group,
    process_group_alive,
    resolve_command,
    run_command,
)

SCRIPTS = Path(__file__).parent / "scripts"
PY = sys.executable

pytestmark = pytest.mark.timeout(30)


def run_script(tmp_path: Path, name: str, **kwargs: object) -> RunResult:
    kwargs.setdefault("timeout_s", 10.0)
    return run_command(
        [PY, str(SCRIPTS / name)],
        cwd=tmp_path,
        log_path=tmp_path / "logs" / f"{name}.log",
        **kwargs,  # type: ignore[arg-type]
    )


def is_dead(pid: int) -> bool:
    """Gone, or a zombie (a reparented zombie is not ours to reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return any(line.startswith("State:") and "Z" in line.split()[1] for line in status.splitlines())


def read_pid(path: Path, within_s: float = 5.0) -> int:
    deadline = time.monotonic() + within_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)
    return int(path.read_text())


# --- scripts that end by themselves ---------------------------------------------------------


def test_ok_summary(tmp_path: Path) -> None:
    lines: list[str] = []
    started: list[tuple[int, int]] = []
    result = run_script(
        tmp_path,
        "ok_summary.py",
        on_line=lines.append,
        on_start=lambda pid, pgid: started.append((pid, pgid)),
    )
    assert result.outcome is Outcome.EXITED
    assert result.exit_code == 0 and result.signal is None
    assert result.ok and not result.fail_marker and result.error is None
    assert result.summary["val_bpb"] == pytest.approx(0.9979)
    assert result.summary["num_steps"] == 953.0
    assert math.isnan(result.summary["mfu_percent"])  # type: ignore[arg-type]
    assert set(result.summary) == {
        "val_bpb",
        "training_seconds",
        "total_seconds",
        "peak_memory_mb",
        "mfu_percent",
        "total_tokens_M",
        "num_steps",
        "num_params_M",
    }
    progress = [line for line in lines if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in progress] == ["step 1", "step 2", "step 3"]
    assert lines[-1].startswith("num_params_M")
    assert len(started) == 1
    pid, pgid = started[0]
    assert pgid == pid == result.pgid and pgid != os.getpgrp()
    assert "val_bpb" in result.log_tail
    assert result.log_path.read_text().startswith("step 1 | loss 4.50")
    assert 0 < result.wall_s < 10


@pytest.mark.parametrize(
    ("script", "error_word"),
    [
        ("syntax_error.py", "SyntaxError"),
        ("import_error.py", "ModuleNotFoundError"),
        ("memory_error.py", "MemoryError"),
    ],
)
def test_crashing_scripts(tmp_path: Path, script: str, error_word: str) -> None:
    result = run_script(tmp_path, script)
    assert result.outcome is Outcome.EXITED
    assert result.exit_code == 1
    assert not result.ok
    assert result.error is not None and result.error.startswith(error_word)
    assert result.summary == {}
    assert error_word in result.log_tail


def test_memory_error_progress_seen_before_crash(tmp_path: Path) -> None:
    lines: list[str] = []
    result = run_script(tmp_path, "memory_error.py", on_line=lines.append)
    assert lines[0] == "step 1 | loss 4.20 | elapsed 0.1s"
    assert lines[-1] == "MemoryError: simulated allocation failure"
    assert result.error == "MemoryError: simulated allocation failure"


def test_nan_fail_marker(tmp_path: Path) -> None:
    lines: list[str] = []
    result = run_script(tmp_path, "nan_fail.py", on_line=lines.append)
    assert result.outcome is Outcome.EXITED and result.exit_code == 1
    assert result.fail_marker and not result.ok
    assert result.error is None
    assert lines == [
        "step 1 | loss 4.20 | elapsed 0.1s",
        "step 2 | loss nan | elapsed 0.2s",
        "FAIL",
    ]


def test_exit_code_env_and_partial_last_line(tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "print(os.environ['OVERNIGHT_TEST'], os.environ['PYTHONUNBUFFERED'])\n"
        "sys.stdout.write('no newline at the end')\n"
        "sys.exit(3)\n"
    )
    lines: list[str] = []
    result = run_command(
        [PY, "-c", code],
        cwd=tmp_path,
        log_path=tmp_path / "a" / "b" / "run.log",
        timeout_s=10,
        env={"OVERNIGHT_TEST": "hello"},
        on_line=lines.append,
    )
    assert result.outcome is Outcome.EXITED and result.exit_code == 3 and not result.ok
    assert lines == ["hello 1", "no newline at the end"]


def test_signal_we_did_not_send(tmp_path: Path) -> None:
    code = "import os, signal; print('bye', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    result = run_command([PY, "-c", code], cwd=tmp_path, log_path=tmp_path / "r.log", timeout_s=10)
    assert result.outcome is Outcome.SIGNALED
    assert result.signal == signal.SIGKILL and result.exit_code is None and not result.ok


def test_callback_errors_do_not_break_the_run(tmp_path: Path) -> None:
    def boom(*_: object) -> None:
        raise RuntimeError("callback bug")

    result = run_script(tmp_path, "ok_summary.py", on_line=boom, on_start=boom)
    assert result.ok and result.summary["val_bpb"] == pytest.approx(0.9979)


def test_grandchild_killed_after_normal_exit(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    result = run_script(tmp_path, "spawn_and_exit.py", env={"SPAWN_PID_FILE": str(pid_file)})
    assert result.ok
    assert is_dead(read_pid(pid_file))  # dead on return, no waiting
    assert result.pgid is not None and not process_group_alive(result.pgid)


# --- scripts we have to end ------------------------------------------------------------------


def test_timeout_kills_sleeper(tmp_path: Path) -> None:
    # sleeper.py never ends by itself: returning at all means the limit killed it (the module's
    # pytest timeout bounds a hang); only the lower bound on wall time is machine-independent.
    result = run_script(tmp_path, "sleeper.py", timeout_s=1.0, grace_s=0.5)
    assert result.outcome is Outcome.TIMED_OUT
    assert result.exit_code is None and result.signal == signal.SIGTERM
    assert result.wall_s >= 1.0
    assert "sleeping" in result.log_tail
    assert result.pgid is not None and not process_group_alive(result.pgid)


def test_timeout_kills_stubborn_child_and_grandchild(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    result = run_script(
        tmp_path,
        "stubborn.py",
        timeout_s=1.0,
        grace_s=0.5,
        env={"STUBBORN_PID_FILE": str(pid_file)},
    )
    assert result.outcome is Outcome.TIMED_OUT  # it never ends by itself: the limit ended it
    assert result.signal == signal.SIGKILL  # SIGTERM was ignored
    assert result.wall_s >= 1.0 + 0.5  # the grace period was given before SIGKILL
    assert is_dead(read_pid(pid_file))  # dead on return, no waiting
    assert result.pgid is not None and not process_group_alive(result.pgid)


def test_stop_event_cancels(tmp_path: Path) -> None:
    stop = threading.Event()

    def on_line(line: str) -> None:  # stop once the script is demonstrably running
        if "sleeping" in line:
            stop.set()

    # the limit is far beyond the module's pytest timeout: only the stop can end this run
    result = run_script(
        tmp_path, "sleeper.py", timeout_s=600.0, grace_s=0.5, stop_event=stop, on_line=on_line
    )
    assert result.outcome is Outcome.STOPPED
    assert result.exit_code is None and not result.ok
    assert "sleeping" in result.log_tail
    assert result.pgid is not None and not process_group_alive(result.pgid)


def test_stop_event_already_set(tmp_path: Path) -> None:
    stop = threading.Event()
    stop.set()
    result = run_script(
        tmp_path,
        "stubborn.py",
        timeout_s=10.0,
        grace_s=0.2,
        stop_event=stop,
        env={"STUBBORN_PID_FILE": str(tmp_path / "unused.pid")},
    )
    assert result.outcome is Outcome.STOPPED
    assert result.pgid is not None and not process_group_alive(result.pgid)


# --- commands that never start ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["missing", "empty", "not-executable"])
def test_failed_to_start(tmp_path: Path, kind: str) -> None:
    script = tmp_path / "plain.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    argv = {"missing": ["overnight-no-such-command-xyz", "--flag"], "empty": []}.get(
        kind, [str(script)]
    )
    log_path = tmp_path / "logs" / "run.log"
    result = run_command(argv, cwd=tmp_path, log_path=log_path, timeout_s=5)
    assert result.outcome is Outcome.FAILED_TO_START
    assert result.exit_code is None and result.pgid is None and not result.ok
    assert result.error
    assert "failed to start" in log_path.read_text()
    assert result.log_tail.startswith("failed to start")


def test_missing_cwd_fails_to_start(tmp_path: Path) -> None:
    result = run_command(
        [PY, "-c", "pass"], cwd=tmp_path / "nope", log_path=tmp_path / "r.log", timeout_s=5
    )
    assert result.outcome is Outcome.FAILED_TO_START
    assert result.error is not None and "FileNotFoundError" in result.error


# --- helpers -------------------------------------------------------------------------------


def test_resolve_command() -> None:
    assert resolve_command("python train.py") == [sys.executable, "train.py"]
    assert resolve_command("python3 -u 'my train.py' --x=1") == [
        sys.executable,
        "-u",
        "my train.py",
        "--x=1",
    ]
    assert resolve_command("python train.py", python="/opt/py") == ["/opt/py", "train.py"]
    assert resolve_command("uv run train.py python") == ["uv", "run", "train.py", "python"]
    assert resolve_command("python3.11 x.py") == ["python3.11", "x.py"]
    assert resolve_command("") == []


def test_kill_process_group_for_orphans(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    proc = subprocess.Popen(
        [PY, str(SCRIPTS / "stubborn.py")],
        env={**os.environ, "STUBBORN_PID_FILE": str(pid_file)},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        grandchild = read_pid(pid_file)
        assert process_group_alive(proc.pid)
        assert kill_process_group(proc.pid, grace_s=0.3) is True
        assert is_dead(grandchild)
        assert not process_group_alive(proc.pid)  # our own child lingers as a zombie only
    finally:
        proc.kill()
        proc.wait()
    assert kill_process_group(proc.pid, grace_s=0.1) is False
    assert not process_group_alive(proc.pid)


def test_kill_process_group_refuses_own_group_and_init() -> None:
    assert kill_process_group(os.getpgrp(), grace_s=0) is False
    assert kill_process_group(1, grace_s=0) is False
    assert kill_process_group(0, grace_s=0) is False
    assert process_group_alive(os.getpgrp())
    assert not process_group_alive(0)


CALLER = """
import json, sys
from pathlib import Path
from runner import run_command

log, limit = Path(sys.argv[1]), float(sys.argv[2])
hang = "import os, time; print('pid', os.getpid(), flush=True); time.sleep(600)"
r = run_command([sys.executable, "-c", hang], cwd=log.parent, log_path=log, timeout_s=limit,
                grace_s=0.5)
print(json.dumps({"outcome": r.outcome.value, "exit_code": r.exit_code, "tail": r.log_tail}))
"""


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def _frozen_mid_run(tmp_path: Path, limit_s: float) -> tuple[subprocess.Popen[str], int] | None:
    """A caller running a hung child under `limit_s`, SIGSTOPped while the child lives; None
    when the machine was too slow to freeze it before the limit (the caller is then ended)."""
    log = tmp_path / f"run-{limit_s:g}.log"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    caller = subprocess.Popen([PY, "-c", CALLER, str(log), str(limit_s)],
                              stdout=subprocess.PIPE, text=True, env=env)
    while "pid " not in (log.read_text() if log.exists() else ""):
        assert caller.poll() is None, "the caller ended before its run started"
        time.sleep(0.02)
    os.kill(caller.pid, signal.SIGSTOP)  # the watchdog thread is frozen with it
    while _state(caller.pid) != "T":
        time.sleep(0.01)
    child = int(log.read_text().split("pid ")[1].split()[0])
    if is_dead(child):  # the watchdog got there first: freeze it earlier, next time
        os.kill(caller.pid, signal.SIGCONT)
        caller.communicate(timeout=120)
        return None
    return caller, child


@pytest.mark.timeout(300)
def test_the_limit_holds_while_the_caller_is_frozen(tmp_path: Path) -> None:
    """The service frozen (SIGSTOP) mid-run: the run's own supervisor (runner/reaper.py) still
    kills it past its limit, and the caller, thawed, records a timeout."""
    frozen = None
    for limit_s in (1.0, 5.0, 30.0):  # a busy machine may need a longer run to freeze in time
        frozen = _frozen_mid_run(tmp_path, limit_s)
        if frozen is not None:
            break
    assert frozen is not None, "the caller could not be frozen before its run's limit"
    caller, child = frozen
    try:
        while not is_dead(child):  # bounded by the test's timeout: a hang is the failure
            time.sleep(0.1)
        assert _state(caller.pid) == "T"  # it died while nothing of the caller ran
    finally:
        os.kill(caller.pid, signal.SIGCONT)
    out, _ = caller.communicate(timeout=120)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["outcome"] == Outcome.TIMED_OUT.value and result["exit_code"] is None
    assert "killed it at its hard time limit" in result["tail"]
