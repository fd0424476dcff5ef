"""Helpers for the service tests and benchmarks: a counting fake target, diffs, a real server.

The target is the fake trainer with independent knobs K0..K{n-1}: metric = score(LR, WIDTH,
USE_TRICK) - 0.001 * sum(K). Setting Ki to 1 is always an improvement, to -1 always worse, and
diffs on different Ki never conflict, so many can be queued at once. Each run appends its
OVERNIGHT_EXPERIMENT_ID to $FAKE_RUN_LOG when it starts (to count run starts).
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from agent.gitrepo import init_repo

ROOT = Path(__file__).resolve().parent.parent
FAKE_TARGET = ROOT / "tests" / "fixtures" / "fake_target"
TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
N_KNOBS = 300
_FILLER = 7  # lines between knobs, so hunks on different knobs never share context

TRAIN_TEMPLATE = '''"""Fake trainer for service tests: metric = score(...) - 0.001 * sum(K)."""

import os
import re
import sys
import time

from prepare import score

_RUN_LOG = os.environ.get("FAKE_RUN_LOG")
if _RUN_LOG:
    with open(_RUN_LOG, "a") as fh:
        fh.write(os.environ.get("OVERNIGHT_EXPERIMENT_ID", "?") + "\\n")

LR = 0.01  # best at 0.04
WIDTH = 64  # best at 256
USE_TRICK = False  # True helps by 0.05
SLEEP_S = {sleep}  # knobs: skip
{knobs}
K_SUM = sum(v for k, v in dict(globals()).items() if re.fullmatch(r"K\\d+", k))

budget = float(os.environ.get("OVERNIGHT_BUDGET_S", "1"))
start = time.time()
for step in range(1, 4):
    elapsed = time.time() - start
    print(f"step {{step}} | loss {{5.0 / step:.4f}} | elapsed {{elapsed:.2f}}s", flush=True)
    time.sleep(min(SLEEP_S, budget) / 3)
value = score(LR, WIDTH, USE_TRICK) - 0.001 * K_SUM
print("---")
print(f"val_bpb:          {{value:.6f}}")
print(f"training_seconds: {{time.time() - start:.1f}}")
print("peak_memory_mb:   2048.0")
print("num_steps:        3")
'''


def train_source(sleep_s: float = 0.0, n_knobs: int = N_KNOBS) -> str:
    knobs = []
    for i in range(n_knobs):
        knobs.append(f"K{i} = 0  # knobs: skip")
        knobs += [f"# filler {i}.{j}" for j in range(_FILLER)]
    return TRAIN_TEMPLATE.format(sleep=float(sleep_s), knobs="\n".join(knobs))


def make_counting_target(dest: Path, sleep_s: float = 0.0, n_knobs: int = N_KNOBS) -> Path:
    """A git target whose runs are counted and last about `sleep_s` (capped by the budget)."""
    shutil.copytree(FAKE_TARGET, dest, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "train.py").write_text(train_source(sleep_s, n_knobs))
    (dest / ".gitignore").write_text("__pycache__/\n")
    init_repo(dest)
    return dest


def knob_diff(target: Path, knob: int, value: int, base: str | None = None) -> str:
    """A unified diff setting K<knob> to `value` against the committed train.py."""
    old = base if base is not None else _committed_train(target)
    line = f"K{knob} = 0  # knobs: skip"
    assert line in old, f"K{knob} not in train.py"
    new = old.replace(line, f"K{knob} = {value}  # knobs: skip", 1)
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        "a/train.py", "b/train.py"))


def _committed_train(target: Path) -> str:
    return subprocess.run(["git", "show", "HEAD:train.py"], cwd=target, check=True,
                          capture_output=True, text=True).stdout


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)


def read_run_log(path: Path) -> list[int]:
    if not path.is_file():
        return []
    return [int(x) for x in path.read_text().split()]


class ServerProcess:
    """`overnight serve` in a subprocess on an ephemeral loopback port."""

    def __init__(self, db: Path, *, log: Path, env: dict[str, str] | None = None,
                 slots: int = 1, poll_s: float = 0.1, extra: list[str] | None = None) -> None:
        self.db, self.log_path = db, log
        self.env = {**os.environ, **(env or {})}
        cli = str(Path(sys.executable).with_name("overnight"))
        self.argv = [cli, "serve", "--db", str(db), "--port", "0",
                     "--token", TOKEN, "--slots", str(slots), "--poll", str(poll_s),
                     "--log-level", "warning", *(extra or [])]
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout_s: float = 30.0) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as fh:
            self.proc = subprocess.Popen(self.argv, stdout=fh, stderr=subprocess.STDOUT,
                                         env=self.env, cwd=ROOT)

        def started() -> str | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            text = self.log_path.read_text(errors="replace")[offset:]
            m = re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", text)
            return m.group(1) if m else None

        self.url = wait_for(started, timeout_s, "the server to listen", poll_s=0.05)
        return self

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=AUTH, timeout=30.0, **kw)

    def tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)
