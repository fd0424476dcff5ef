"""The Slurm job's half of a run: read the request in the job's folder, run it, write the result.

Runs inside a Slurm batch job (`python -m agent.executors.slurm_job <job folder>`, submitted by
agent.executors.slurm) on a node that shares the work dir with the coordinator. The run is the
same runner.process.run_command as a local run, in the run's worktree: the budget's deadline, the
kill of the whole process tree, the summary block. A SIGTERM to the job (scancel, a preemption, a
requeue, Slurm's own time limit) stops the run the same way, after the grace, and the result
says a signal ended it; the coordinator alone knows whether it asked for that.

The job folder (`JobFiles`) holds request.json (written by the coordinator before sbatch),
job.sh, job_id, slurm.out (the job's own output), run.log (the run's) and result.json. The
result is written once per attempt, atomically (a rename), before the job exits 0; a requeued
job's new attempt removes the one before it. Guaranteed: a result.json on disk is complete and
belongs to the latest attempt that finished. Stdlib + runner only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runner.process import run_command
from runner.result import Outcome, RunResult

ENDED_BY_ITSELF = "itself"  # the command ended, timed out or failed to start on its own
ENDED_BY_SIGNAL = "signal"  # a SIGTERM to the job stopped it (scancel, requeue, time limit)
SLURM_PREFIX = "SLURM_"  # the job's own variables reach the run (SLURM_JOB_ID, …)


@dataclass(frozen=True)
class JobRequest:
    """What the job runs, and what the coordinator needs to adopt it after a restart."""

    argv: list[str]
    cwd: str  # where the command runs (inside the worktree)
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)
    pass_env: list[str] = field(default_factory=list)
    grace_s: float = 5.0
    python: str = ""  # argv[0] equal to this becomes the job's interpreter
    key: str = ""  # what the run is: its tree, command and settings (adoption matches on it)
    experiment_id: int = 0  # the experiment executing it (a restart hands it to its retry)
    tree: str = ""  # the git tree it runs
    own: bool = True  # a run of the executing experiment's own commit (not the incumbent's)
    worktree: str = ""  # the worktree it runs in (kept for it by restart recovery)
    target: str = ""  # the target repository (its worktree list is pruned after an adoption)


@dataclass(frozen=True)
class JobFiles:
    """The files of one job's folder."""

    root: Path

    @property
    def request(self) -> Path:
        return self.root / "request.json"

    @property
    def script(self) -> Path:
        return self.root / "job.sh"

    @property
    def job_id(self) -> Path:
        return self.root / "job_id"

    @property
    def output(self) -> Path:
        return self.root / "slurm.out"

    @property
    def log(self) -> Path:
        return self.root / "run.log"

    @property
    def result(self) -> Path:
        return self.root / "result.json"

    def read_request(self) -> JobRequest:
        return JobRequest(**json.loads(self.request.read_text(encoding="utf-8")))

    def write_request(self, request: JobRequest) -> None:
        write_atomically(self.request, json.dumps(asdict(request)))

    def read_result(self) -> dict[str, Any] | None:
        """The finished attempt's result, or None (none yet, or not readable yet)."""
        try:
            data = json.loads(self.result.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def recorded_job_id(self) -> str | None:
        try:
            return self.job_id.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path` (mode 0600) and rename it into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def result_record(result: RunResult, ended_by: str, node: str, attempt: int) -> dict[str, Any]:
    """A RunResult as result.json holds it (no log path or process group: both are local)."""
    return {"outcome": result.outcome.value, "exit_code": result.exit_code,
            "signal": result.signal, "wall_s": result.wall_s, "summary": result.summary,
            "fail_marker": result.fail_marker, "log_tail": result.log_tail,
            "error": result.error, "ended_by": ended_by, "node": node, "attempt": attempt,
            "job_id": os.environ.get("SLURM_JOB_ID")}


def result_of(record: dict[str, Any], log_path: Path) -> RunResult:
    """result.json's record as the coordinator's RunResult, with its own log path."""
    return RunResult(outcome=Outcome(record["outcome"]), exit_code=record.get("exit_code"),
                     signal=record.get("signal"), wall_s=float(record.get("wall_s") or 0.0),
                     summary=dict(record.get("summary") or {}),
                     fail_marker=bool(record.get("fail_marker")), log_path=log_path,
                     log_tail=str(record.get("log_tail") or ""), pgid=None,
                     error=record.get("error"))


def run_job(folder: Path) -> int:
    """Run the request of `folder` and write its result; the job's exit status (0)."""
    files = JobFiles(folder)
    request = files.read_request()
    attempt = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    files.result.unlink(missing_ok=True)  # an earlier attempt's (the job was requeued)
    stop, signalled = threading.Event(), threading.Event()

    def on_term(_signum: int, _frame: object) -> None:
        signalled.set()
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    argv = list(request.argv)
    if argv and request.python and argv[0] == request.python:
        argv[0] = sys.executable  # the same `python` word, resolved in the job
    slurm_names = [name for name in os.environ if name.startswith(SLURM_PREFIX)]
    result = run_command(argv, cwd=Path(request.cwd), log_path=files.log,
                         timeout_s=request.timeout_s, env=request.env,
                         pass_env=[*request.pass_env, *slurm_names], grace_s=request.grace_s,
                         stop_event=stop)
    # Where Slurm signals the whole job (cgroups), the command may die of the SIGTERM itself:
    # only a clean exit that beat the signal is the run's own end.
    clean = result.outcome is Outcome.EXITED and result.exit_code == 0
    ended_by = ENDED_BY_SIGNAL if signalled.is_set() and not clean else ENDED_BY_ITSELF
    record = result_record(result, ended_by, socket.gethostname(), attempt)
    write_atomically(files.result, json.dumps(record))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m agent.executors.slurm_job <job folder>")
    sys.exit(run_job(Path(sys.argv[1])))
