"""A run never outlives its limit or leaves its room: floods, escapes, stubborn children, env.

Real child processes running planted scripts; every wait is on state with a generous bound.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from runner import Outcome, parse_progress, run_command
from runner.logtail import CUT_NOTE, LogTailer, cap_log
from runner.reaper import pids_with_env
from runner.tree import RUN_ID_ENV, kill_by_run_id

SCRIPTS = Path(__file__).parent / "scripts"
PY = sys.executable

pytestmark = pytest.mark.timeout(60)


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def read_pid(path: Path, within_s: float = 10.0) -> int:
    deadline = time.monotonic() + within_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)
    return int(path.read_text())


def run_script(tmp_path: Path, name: str, **kwargs: object):  # type: ignore[no-untyped-def]
    return run_command(
        [PY, str(SCRIPTS / name)],
        cwd=tmp_path,
        log_path=tmp_path / "logs" / f"{name}.log",
        grace_s=0.5,
        **kwargs,  # type: ignore[arg-type]
    )


def test_flooding_trainer_is_killed_and_its_log_capped(tmp_path: Path) -> None:
    points = []

    def on_line(line: str) -> None:
        point = parse_progress(line)
        if point is not None:
            points.append(point)

    run_id = "test:flood:0"
    result = run_script(tmp_path, "flood.py", timeout_s=1.5, on_line=on_line,
                        log_max_bytes=2_000_000, env={RUN_ID_ENV: run_id})
    assert result.outcome is Outcome.TIMED_OUT
    assert not pids_with_env(RUN_ID_ENV, run_id)
    assert points and points[-1].step > points[0].step
    text = result.log_path.read_text()
    assert result.log_path.stat().st_size <= 2_000_000
    assert "bytes cut from the middle of this log" in text
    assert text.startswith("step 1 loss")


def test_a_blocked_line_callback_does_not_delay_the_kill(tmp_path: Path) -> None:
    """The deadline is kept by a watchdog even while the caller's callback hangs."""
    run_id = "test:blocked:0"
    seen_dead = threading.Event()

    def on_line(_line: str) -> None:
        if seen_dead.is_set():
            return
        time.sleep(0.2)  # give the run time to start its flood
        bound = time.monotonic() + 30
        while pids_with_env(RUN_ID_ENV, run_id) and time.monotonic() < bound:
            time.sleep(0.05)
        if not pids_with_env(RUN_ID_ENV, run_id):
            seen_dead.set()

    result = run_script(tmp_path, "flood.py", timeout_s=1.0, on_line=on_line,
                        env={RUN_ID_ENV: run_id, "FLOOD_IGNORE_TERM": "1"})
    assert seen_dead.is_set(), "the run was still alive while the callback was blocked"
    assert result.outcome is Outcome.TIMED_OUT and result.signal == signal.SIGKILL


def test_sigterm_ignoring_flood_is_killed(tmp_path: Path) -> None:
    run_id = "test:stubborn-flood:0"
    result = run_script(tmp_path, "flood.py", timeout_s=1.0,
                        env={RUN_ID_ENV: run_id, "FLOOD_IGNORE_TERM": "1"})
    assert result.outcome is Outcome.TIMED_OUT and result.signal == signal.SIGKILL
    assert not pids_with_env(RUN_ID_ENV, run_id)


def test_setsid_grandchild_is_killed_when_the_trainer_exits(tmp_path: Path) -> None:
    """No run id given: the reaper (a child subreaper) alone must catch the escape."""
    pid_file = tmp_path / "escaped.pid"
    result = run_script(tmp_path, "escape.py", timeout_s=20,
                        env={"ESCAPE_PID_FILE": str(pid_file), "ESCAPE_PARENT": "exit"})
    assert result.ok, result.log_tail
    assert not alive(read_pid(pid_file))  # dead on return, no waiting


def test_setsid_grandchild_is_killed_at_the_deadline(tmp_path: Path) -> None:
    pid_file = tmp_path / "escaped.pid"
    result = run_script(tmp_path, "escape.py", timeout_s=1.5,
                        env={"ESCAPE_PID_FILE": str(pid_file)})
    assert result.outcome is Outcome.TIMED_OUT
    assert not alive(read_pid(pid_file))


def test_stop_kills_the_escaped_grandchild(tmp_path: Path) -> None:
    pid_file = tmp_path / "escaped.pid"
    stop = threading.Event()

    def on_line(line: str) -> None:
        if "escaped" in line:
            stop.set()

    result = run_script(tmp_path, "escape.py", timeout_s=30, on_line=on_line, stop_event=stop,
                        env={"ESCAPE_PID_FILE": str(pid_file)})
    assert result.outcome is Outcome.STOPPED
    assert not alive(read_pid(pid_file))


def test_kill_by_run_id_finds_a_process_wherever_it_moved(tmp_path: Path) -> None:
    """What recovery relies on: a process that left every group and folder still carries its id."""
    import subprocess

    pid_file = tmp_path / "escaped.pid"
    env = {**os.environ, "ESCAPE_PID_FILE": str(pid_file), RUN_ID_ENV: "abc:7:0"}
    proc = subprocess.Popen([PY, str(SCRIPTS / "escape.py")], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        grandchild = read_pid(pid_file)
        assert os.readlink(f"/proc/{grandchild}/cwd") == "/"
        assert kill_by_run_id("abc:8:", prefix=True) == []  # another experiment: untouched
        assert alive(grandchild)
        found = kill_by_run_id("abc:7:", prefix=True)
        assert grandchild in found and proc.pid in found
        assert not alive(grandchild)
    finally:
        proc.kill()
        proc.wait()


def test_guest_environment_has_no_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {"ANTHROPIC_API_KEY": "sk-ant-fake", "OPENAI_API_KEY": "sk-fake",
               "OVERNIGHT_TOKEN": "fake-token-1234567890",
               "AWS_SECRET_ACCESS_KEY": "aws-fake-secret"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("WANDB_PROJECT", "mine")
    monkeypatch.setenv("SOMETHING_ELSE", "nope")
    monkeypatch.setenv("OVERNIGHT_DB", "/secret/place.db")
    monkeypatch.setenv("OVERNIGHT_DATA_DIR", "/data/cache")  # a target's own setting
    code = "import os\nfor k, v in sorted(os.environ.items()):\n    print(f'{k}={v}')\n"
    result = run_command([PY, "-c", code], cwd=tmp_path, log_path=tmp_path / "env.log",
                         timeout_s=20, env={"OVERNIGHT_SEED": "4"}, pass_env=["WANDB_PROJECT"])
    assert result.ok
    dumped = dict(line.split("=", 1) for line in result.log_path.read_text().splitlines())
    assert not set(secrets) & set(dumped)
    assert not any(value in result.log_path.read_text() for value in secrets.values())
    assert "SOMETHING_ELSE" not in dumped and "OVERNIGHT_DB" not in dumped
    assert dumped["OVERNIGHT_DATA_DIR"] == "/data/cache"
    assert dumped["CUDA_VISIBLE_DEVICES"] == "3" and dumped["WANDB_PROJECT"] == "mine"
    assert dumped["OVERNIGHT_SEED"] == "4" and dumped["PATH"] == os.environ["PATH"]


def test_cap_log_keeps_head_and_tail(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_text("".join(f"line {i}\n" for i in range(100_000)))
    size = log.stat().st_size
    cut = cap_log(log, 50_000)
    text = log.read_text()
    assert 0 < cut < size and log.stat().st_size <= 50_000
    assert text.startswith("line 0\n") and text.endswith("line 99999\n")
    assert CUT_NOTE.format(cut=cut, total=size) in text
    assert cap_log(log, 50_000) == 0  # already small enough: untouched


def test_tailer_far_behind_skips_to_the_newest_lines(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("".join(f"step {i} loss 1.0\n" for i in range(1, 200_001)))
    lines: list[str] = []
    LogTailer(log, lines.append).flush()
    assert lines[0].startswith("[overnight: skipped")
    assert lines[-1] == "step 200000 loss 1.0"
    assert all(line.startswith("step ") for line in lines[1:])
    assert len(lines) < 200_000
