"""adopt's probe: the command run once, briefly, from a throw-away worktree, to see what it prints.

The committed HEAD is checked out in a temporary worktree (the data adopt found outside git
linked in, as for a sweep's runs) and the full command runs there with `OVERNIGHT_BUDGET_S` set
to the probe's seconds. It is stopped after a few lines with a training loss, at the end of
its wall limit, or when it ends. What it printed decides the progress_regex adopt offers;
where it imported the repository's own packages from (agent.ops.doctor_imports) decides the
command; a failure is reported with its last traceback line.
"""

from __future__ import annotations

import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from agent.git.repo import GitRepo
from agent.ops.adopt_progress import loss_lines
from agent.ops.doctor_imports import ImportFacts, import_facts
from runner.process import resolve_command, run_command
from runner.result import Outcome

PROBE_S = 60.0  # the wall limit of the probe run
ENOUGH_LINES = 3  # lines with a loss: enough to fit a progress_regex


@dataclass(frozen=True)
class Probe:
    """What the probe run printed and how it ended."""

    lines: list[str]
    wall_s: float
    ended: str  # how: stopped after enough lines, stopped at the limit, finished, failed
    error: str | None = None
    imports: ImportFacts | None = None


def _link(worktree: Path, root: Path, assets: list[str]) -> None:
    for asset in assets:
        if Path(asset).is_absolute():
            continue
        link = worktree / asset
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(root / asset)


def probe(root: Path, command: str, assets: list[str], seconds: float = PROBE_S) -> Probe:
    """Run `command` (as the user runs it, flags included) from a worktree of HEAD."""
    repo = GitRepo(root)
    head = repo.head("HEAD")
    stop = threading.Event()
    losses: list[str] = []

    def on_line(line: str) -> None:
        losses.extend(loss_lines([line]))
        if len(losses) >= ENOUGH_LINES:
            stop.set()

    with tempfile.TemporaryDirectory(prefix="overnight-adopt-") as tmp:
        worktree = Path(tmp) / "wt"
        repo.add_worktree(worktree, head)
        try:
            _link(worktree, root, assets)
            argv = resolve_command(command)
            env = {"OVERNIGHT_BUDGET_S": f"{seconds:g}", "OVERNIGHT_SEED": "42",
                   "OVERNIGHT_EXPERIMENT_ID": "adopt-probe"}
            imports = import_facts(argv, worktree, worktree, env, command)
            result = run_command(argv, cwd=worktree, log_path=Path(tmp) / "probe.log",
                                 timeout_s=seconds, env=env, grace_s=2.0, on_line=on_line,
                                 stop_event=stop)
            lines = (Path(tmp) / "probe.log").read_text(errors="replace").splitlines()
        finally:
            repo.remove_worktree(worktree)
    if stop.is_set():
        ended = f"stopped after {ENOUGH_LINES} lines with a loss"
    elif result.outcome is Outcome.TIMED_OUT:
        ended = f"stopped at the probe's {seconds:g} s limit"
    elif result.exit_code == 0:
        ended = "finished"
    else:
        ended = "failed"
    error = (result.error or f"exit code {result.exit_code}") if ended == "failed" else None
    return Probe(lines, result.wall_s, ended, error, imports)
