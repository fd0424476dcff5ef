"""adopt's probe: the command run once, briefly, to see what it prints and how long it trains.

The committed HEAD is checked out in a temporary worktree (the data adopt found outside git
linked in, as for a sweep's runs) and the full command runs there with `OVERNIGHT_BUDGET_S`
set to the probe's seconds. Once it has printed ENOUGH_LINES lines with a training loss, it
may run on until SETTLE_S from its start (a script that trains in a second ends by itself
meanwhile); then it is stopped. It also stops at its wall limit, or when it ends. What it
printed decides the progress_regex adopt offers; where it imported the repository's own
packages from (agent.ops.doctor) decides the command; a failure is reported with its last
traceback line; a run that ended by itself, well inside the probe's budget, gives budget_s
its training time (the summary's `training_seconds`, else the run's wall time).
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.git.repo import GitRepo
from agent.ops.adopt_contract import loss_lines
from agent.ops.doctor import ImportFacts, import_facts
from runner.process import resolve_command, run_command
from runner.result import Outcome
from runner.summary import parse_summary

PROBE_S = 60.0  # the wall limit of the probe run
ENOUGH_LINES = 3  # lines with a loss: enough to fit a progress_regex
SETTLE_S = 10.0  # after those lines, how long from its start the run may go on to end by itself
ITS_OWN_END = 0.5  # a run that trained under this share of the probe's budget ended by itself
# budget_s for a script that trains in seconds: the first of these over its training time
# (with room for a slower run).
BUDGETS_S = (1, 2, 3, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 240, 300)
ROOM = 1.25


@dataclass(frozen=True)
class Probe:
    """What the probe run printed and how it ended."""

    lines: list[str]
    wall_s: float
    ended: str  # how: stopped after enough lines, stopped at the limit, finished, failed
    error: str | None = None
    imports: ImportFacts | None = None
    summary: dict[str, float | str] = field(default_factory=dict)  # its `---` block, if any
    seconds: float = PROBE_S  # the probe's budget and wall limit

    @property
    def trained_s(self) -> float | None:
        """The seconds the script trained when it ended by itself, well inside the probe's
        budget: the summary's training_seconds, else the wall time; None otherwise."""
        if self.ended != "finished":
            return None
        said = self.summary.get("training_seconds")
        trained = float(said) if isinstance(said, int | float) else self.wall_s
        return trained if trained < self.seconds * ITS_OWN_END else None


def budget_for(trained_s: float) -> float:
    """A round budget_s that a run training `trained_s` seconds fits in."""
    return float(next((b for b in BUDGETS_S if b >= trained_s * ROOM), BUDGETS_S[-1]))


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
    started = time.monotonic()
    timer: list[threading.Timer] = []

    def on_line(line: str) -> None:
        losses.extend(loss_lines([line]))
        if len(losses) >= ENOUGH_LINES and not timer:
            wait = max(0.0, min(SETTLE_S, seconds) - (time.monotonic() - started))
            timer.append(threading.Timer(wait, stop.set))
            timer[0].start()

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
            text = (Path(tmp) / "probe.log").read_text(errors="replace")
        finally:
            for t in timer:
                t.cancel()
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
    return Probe(text.splitlines(), result.wall_s, ended, error, imports, parse_summary(text),
                 seconds)
