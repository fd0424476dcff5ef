"""The worker's half of a remote run: materialize the commit from a git bundle, run it, report.

Runs on a Ray worker (agent.executors.ray submits `run_remote`), but knows nothing of Ray: lines
and the stop flag go through an `exchange(lines) -> stop?` callable. The commit arrives as a
git bundle, is cloned into a fresh temporary folder and checked out detached; the checked-out
HEAD must be the commit asked for, or nothing runs. Relative assets are linked from the same
absolute folder as on the coordinator (`asset_root`), which must exist on every worker. The run
itself is the same runner.process.run_command as a local run (deadline, process-tree kill,
summary parsing). After it, the watched files (protected + assets) are hashed; those that differ
from the coordinator's expected hashes are reported, so the coordinator's tamper check sees them.
Guaranteed: the temporary folder is removed on return. Stdlib + runner + agent.git.filehash only.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from agent.git.filehash import hash_paths
from runner.process import run_command
from runner.result import Outcome, RunResult, tail_lines

logger = logging.getLogger(__name__)

EXCHANGE_EVERY_S = 0.5  # how often lines go back and the stop flag is read
GIT_TIMEOUT_S = 120.0
CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
Exchange = Callable[[list[str]], bool]  # send lines; True when the coordinator asks to stop


@dataclass(frozen=True)
class RemoteRequest:
    """Everything a worker needs for one run, apart from the bundle's bytes."""

    commit: str
    argv: list[str]
    workdir: str  # where the command runs, relative to the worktree
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)
    pass_env: tuple[str, ...] = ()
    grace_s: float = 5.0
    coordinator_python: str = ""  # argv[0] equal to this becomes the worker's interpreter
    asset_root: str = ""  # the target's folder: relative assets are linked from below it
    assets: tuple[str, ...] = ()
    expected: dict[str, str] = field(default_factory=dict)  # watched path -> hash
    cache_key: str = "default"  # the sweep: its torch.compile cache folder on the worker


@dataclass(frozen=True)
class RemoteOutcome:
    """What comes back: the run's result (log_path is the worker's), its log, what changed."""

    result: RunResult
    log: bytes
    changed: dict[str, str]  # watched path -> the hash the worker found (differs from expected)
    node: str


def run_remote(request: RemoteRequest, bundle: bytes, exchange: Exchange,
               node: str = "") -> RemoteOutcome:
    """Materialize `request.commit` from `bundle` in a temporary folder and run it there."""
    tmp = Path(tempfile.mkdtemp(prefix="overnight-run-"))
    log_path = tmp / "run.log"
    try:
        wt = tmp / "wt"
        problem = materialize(bundle, request.commit, tmp, wt) or link_assets(request, wt)
        if problem:
            return RemoteOutcome(_not_started(log_path, f"on {node or 'the worker'}: {problem}"),
                                 log_path.read_bytes(), {}, node)
        result = _run(request, wt, log_path, exchange)
        changed = {p: h for p, h in hash_paths(wt, list(request.expected)).items()
                   if h != request.expected[p]}
        return RemoteOutcome(result, log_path.read_bytes(), changed, node)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def materialize(bundle: bytes, commit: str, tmp: Path, wt: Path) -> str | None:
    """Clone the bundle into `wt` and check out `commit`; why not, or None when done."""
    path = tmp / "commit.bundle"
    path.write_bytes(bundle)
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    steps = [["git", "clone", "--quiet", "--no-checkout", str(path), str(wt)],
             ["git", "-C", str(wt), "checkout", "--quiet", "--detach", commit]]
    try:
        for argv in steps:
            subprocess.run(argv, check=True, capture_output=True, text=True, env=env,
                           timeout=GIT_TIMEOUT_S)
        head = subprocess.run(["git", "-C", str(wt), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True, env=env,
                              timeout=GIT_TIMEOUT_S).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        return f"cannot materialize commit {commit[:12]} from its bundle: {detail}".strip()
    finally:
        path.unlink(missing_ok=True)
    if head != commit:
        return f"the bundle checked out {head[:12]}, not the commit asked for {commit[:12]}"
    return None


def link_assets(request: RemoteRequest, wt: Path) -> str | None:
    """Link relative assets from `asset_root` (as agent.ops.sweeps.link_assets does locally)."""
    for asset in request.assets:
        source = Path(asset) if Path(asset).is_absolute() else Path(request.asset_root) / asset
        if not source.exists():
            return (f"asset {asset!r} not found at {source}: every worker needs the target's "
                    "assets at the same path as the coordinator")
        if not Path(asset).is_absolute():
            link = wt / asset
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(source)
    return None


def worker_env(request: RemoteRequest) -> dict[str, str]:
    """The run's environment with the compile caches in a per-sweep folder on this worker."""
    cache = Path(tempfile.gettempdir()) / "overnight-cache" / request.cache_key
    env = dict(request.env)
    env.update({"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
                "TRITON_CACHE_DIR": str(cache / "triton")})
    return env


def _run(request: RemoteRequest, wt: Path, log_path: Path, exchange: Exchange) -> RunResult:
    argv = list(request.argv)
    if argv and request.coordinator_python and argv[0] == request.coordinator_python:
        argv[0] = sys.executable  # the same `python` word, resolved on this machine
    relay = _Relay(exchange)
    relay.start()
    try:
        return run_command(argv, cwd=wt / request.workdir, log_path=log_path,
                           timeout_s=request.timeout_s, env=worker_env(request),
                           pass_env=request.pass_env, grace_s=request.grace_s,
                           on_line=relay.add, stop_event=relay.stop)
    finally:
        relay.close()


class _Relay(threading.Thread):
    """Sends log lines back in batches and turns the coordinator's stop into `stop`."""

    def __init__(self, exchange: Exchange) -> None:
        super().__init__(name="overnight-relay", daemon=True)
        self.exchange = exchange
        self.stop = threading.Event()
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._unreachable = False

    def add(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)

    def run(self) -> None:
        while not self._closed.wait(EXCHANGE_EVERY_S):
            self._send()

    def _send(self) -> None:
        with self._lock:
            batch, self._lines = self._lines, []
        try:
            if self.exchange(batch):
                self.stop.set()
        except Exception as exc:  # the channel is gone: the run goes on to its deadline
            if not self._unreachable:
                logger.warning("cannot reach the coordinator's channel: %s", exc)
            self._unreachable = True

    def close(self) -> None:
        self._closed.set()
        self.join()
        self._send()  # the last lines


def _not_started(log_path: Path, error: str) -> RunResult:
    """A run that never started, with the reason in its log."""
    log_path.write_text(f"failed to start: {error}\n", encoding="utf-8")
    return RunResult(outcome=Outcome.FAILED_TO_START, exit_code=None, signal=None, wall_s=0.0,
                     summary={}, fail_marker=False, log_path=log_path,
                     log_tail=tail_lines(log_path.read_text(encoding="utf-8")), pgid=None,
                     error=error)


def local_result(result: RunResult, log_path: Path) -> RunResult:
    """The worker's result as the coordinator records it: its local log, no (remote) pgid."""
    return replace(result, log_path=log_path, pgid=None)
