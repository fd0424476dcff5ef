"""Running the target's command for one experiment: environment, log, loss curve, confirmations.

Used by agent.loop. Talks to the Store and Runner ports only; knows nothing of git or keep rules.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.domain import Experiment, Sweep, utcnow
from agent.ports import Runner, Store
from runner.process import resolve_command, run_command
from runner.result import RunResult
from runner.summary import ProgressPoint, parse_progress

MAX_REPAIRS = 2
FLUSH_EVERY_S = 2.0

EventFn = Callable[[str, Experiment, dict[str, Any]], None]


@dataclass
class LoopSettings:
    work_dir: Path  # worktrees/ and logs/ live below it
    device: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    grace_s: float = 5.0
    max_repairs: int = MAX_REPAIRS


class SubprocessRunner:
    """The Runner port on runner.process.run_command."""

    def __init__(self, grace_s: float = 5.0) -> None:
        self.grace_s = grace_s

    def run(
        self,
        argv: list[str],
        *,
        cwd: Path,
        log_path: Path,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        on_start: Callable[[int, int], None] | None = None,
        on_line: Callable[[str], None] | None = None,
        stop_event: threading.Event | None = None,
    ) -> RunResult:
        return run_command(
            argv,
            cwd=cwd,
            log_path=log_path,
            timeout_s=timeout_s,
            env=env,
            grace_s=self.grace_s,
            on_start=on_start,
            on_line=on_line,
            stop_event=stop_event,
        )


class LineSink:
    """Collects progress points from log lines; flushes them to the store every few seconds."""

    def __init__(self, store: Store, exp: Experiment, emit: EventFn) -> None:
        self.store, self.exp, self.emit = store, exp, emit
        self.pending: list[ProgressPoint] = []
        self.count = 0
        self.last_flush = time.monotonic()

    def __call__(self, line: str) -> None:
        point = parse_progress(line)
        self.emit("line", self.exp, {"line": line, "point": point})
        if point is None:
            return
        self.count += 1
        self.pending.append(point)
        if time.monotonic() - self.last_flush > FLUSH_EVERY_S:
            self.flush()

    def flush(self) -> None:
        points, self.pending = self.pending, []
        self.last_flush = time.monotonic()
        if points:
            self.store.add_loss_points(self.exp.id, points)


class TrainingRuns:
    def __init__(self, store: Store, runner: Runner, settings: LoopSettings, emit: EventFn) -> None:
        self.store, self.runner, self.settings, self.emit = store, runner, settings, emit

    def run(
        self, sweep: Sweep, exp: Experiment, wt: Path, stop: threading.Event
    ) -> tuple[RunResult, bool]:
        """Run the target's command in the worktree; (result, whether training started)."""
        config = sweep.config
        log_path = self.settings.work_dir / "logs" / sweep.name / f"{exp.id}.log"
        env = self.env(sweep, exp, sweep.seed)
        self.store.mark_started(exp.id, log_path=str(log_path), run_started_at=utcnow())
        sink = LineSink(self.store, exp, self.emit)
        self.emit("started", self.store.get_experiment(exp.id), {"budget_s": config.budget_s})

        def on_start(pid: int, pgid: int) -> None:
            self.store.mark_started(exp.id, pgid=pgid)

        try:
            result = self.runner.run(
                resolve_command(config.command),
                cwd=wt,
                log_path=log_path,
                timeout_s=config.timeout_s,
                env=env,
                on_start=on_start,
                on_line=sink,
                stop_event=stop,
            )
        finally:
            sink.flush()
        return result, sink.count > 0

    def env(self, sweep: Sweep, exp: Experiment, seed: int) -> dict[str, str]:
        config = sweep.config
        env = {
            "OVERNIGHT_BUDGET_S": f"{config.budget_s:g}",
            "OVERNIGHT_SEED": str(seed),
            "OVERNIGHT_EXPERIMENT_ID": str(exp.id),
            **self.settings.env,
        }
        if self.settings.device:
            env["OVERNIGHT_DEVICE"] = self.settings.device
        return env

    def confirm(
        self, sweep: Sweep, exp: Experiment, wt: Path, stop: threading.Event, first: float
    ) -> tuple[float | None, str]:
        """Re-run a would-be keep with other seeds; (mean metric or None, a reason line)."""
        config = sweep.config
        samples = [first]
        for k in range(1, config.confirm_runs + 1):
            log = self.settings.work_dir / "logs" / sweep.name / f"{exp.id}.confirm{k}.log"
            self.emit("confirming", exp, {"run": k, "of": config.confirm_runs})
            result = self.runner.run(
                resolve_command(config.command),
                cwd=wt,
                log_path=log,
                timeout_s=config.timeout_s,
                env=self.env(sweep, exp, sweep.seed + k),
                stop_event=stop,
            )
            value = result.summary.get(config.metric)
            if not (result.ok and isinstance(value, int | float) and math.isfinite(value)):
                why = result.error or result.outcome.value
                return None, f"confirmation run {k} (seed {sweep.seed + k}) failed: {why}"
            samples.append(float(value))
        mean = sum(samples) / len(samples)
        runs = ", ".join(f"{v:.6f}" for v in samples)
        return (
            mean,
            f"{config.metric} is the mean of {len(samples)} runs (seeds "
            f"{sweep.seed}..{sweep.seed + config.confirm_runs}): {runs}",
        )
