"""Running the target's command once, as a run record: environment, log, loss curve, pgid.

Used by agent.engine.loop. Talks to the Store and Runner ports only; knows nothing of git or
keep rules.
Each run carries OVERNIGHT_RUN_ID = "<work-dir key>:<experiment id>:<k>" (the experiment
executing it; k = 0 for its first run, then the run record's id), so recovery can find every
process of an interrupted experiment.
The loss curve is downsampled to at most MAX_LOSS_POINTS (+ the last point) per run; each
run also records its curve by fraction of the budget (runs.curve), and a change's own run is
stopped early when that curve is clearly behind the incumbent's (agent.engine.early_stop).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent.core.config import TargetConfig, extra_args
from agent.core.domain import Experiment, Run, RunEnd, RunSpec, RunStatus, Sweep, utcnow
from agent.core.errors import (
    ConfigError,
    OutOfSpaceError,
    RunNotStartedError,
    StoreError,
    WorkerLostError,
)
from agent.core.ports import Runner, Store
from agent.core.private import DIR_MODE
from agent.core.record import StopPoint
from agent.engine.early_stop import (
    EarlyStop,
    RunCurve,
    RunStop,
    build_reference,
    earlier_curves,
    may_stop_early,
)
from agent.engine.gather import USABLE, sweep_speed_noise
from agent.engine.salvage import (
    CHECKPOINT_ENV,
    EVAL_LOG_SUFFIX,
    RETRY_ENV,
    fresh_checkpoint_dir,
    merged,
    salvageable,
)
from agent.rules.decide import Rule, stop_level
from agent.rules.holdout import redact, redact_bytes, seal_summary
from agent.rules.throughput import ProgressMeter, speed
from runner.process import resolve_command
from runner.result import Outcome, RunResult
from runner.sandbox import bwrap_command
from runner.summary import ProgressPoint, parse_progress
from runner.tree import RUN_ID_ENV

MAX_REPAIRS = 2
FLUSH_EVERY_S = 2.0
MAX_LOSS_POINTS = 4000
# Folders the service hands a run through its environment that stay writable in the sandbox.
CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")

logger = logging.getLogger(__name__)
EventFn = Callable[[str, Experiment, dict[str, Any]], None]


def emit_to(on_event: EventFn | None, kind: str, exp: Experiment,
            data: dict[str, Any] | None = None) -> None:
    """Hand an event to the display; a display problem must never stop the night."""
    if on_event is not None:
        try:
            on_event(kind, exp, data or {})
        except Exception:
            logger.exception("event handler failed for %s", kind)


@dataclass
class LoopSettings:
    work_dir: Path  # worktrees/ and logs/ live below it
    device: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    grace_s: float = 5.0
    max_repairs: int = MAX_REPAIRS


def run_id_prefix(work_dir: Path, experiment_id: int) -> str:
    """What every OVERNIGHT_RUN_ID of one experiment starts with ("<key>:<id>:")."""
    key = hashlib.sha256(str(Path(work_dir).expanduser().resolve()).encode()).hexdigest()[:12]
    return f"{key}:{experiment_id}:"


class LossCurve:
    """Keeps every k-th progress point, doubling k whenever more than ``cap`` are kept."""

    def __init__(self, cap: int = MAX_LOSS_POINTS) -> None:
        self.cap, self.stride, self.seen = cap, 1, 0
        self.kept: list[tuple[int, ProgressPoint]] = []
        self.last: tuple[int, ProgressPoint] | None = None

    def add(self, point: ProgressPoint) -> bool:
        """Take one point; True when earlier kept points were dropped (thinned)."""
        index, self.seen = self.seen, self.seen + 1
        self.last = (index, point)
        if index % self.stride:
            return False
        self.kept.append((index, point))
        if len(self.kept) <= self.cap:
            return False
        self.stride *= 2
        self.kept = [(i, p) for i, p in self.kept if i % self.stride == 0]
        return True

    def points(self, with_last: bool = False) -> list[ProgressPoint]:
        """The kept points, plus the last one seen when asked (the end of the curve)."""
        kept = [p for _, p in self.kept]
        if with_last and self.last is not None and (not self.kept or self.kept[-1] != self.last):
            kept.append(self.last[1])
        return kept


class ProgressLines:
    """Reads a run's progress lines into its ProgressMeter (its throughput when the summary
    block has none) and its curve by fraction of the budget (elapsed / budget from the line,
    else the service's clock since the run started; on a budget of steps, step / steps; on
    one of tokens, none: the lines do not count tokens): every run has one; the experiment's
    first run's also keeps the step-wise loss curve. A challenger run's early stop
    (agent.engine.early_stop) is fed each point."""

    def __init__(self, pattern: re.Pattern[str] | None = None, budget_s: float | None = None,
                 early_stop: EarlyStop | None = None, budget_steps: int | None = None) -> None:
        self.pattern = pattern
        self.count = 0
        self.meter = ProgressMeter()
        self.budget_s, self.early_stop = budget_s, early_stop
        self.budget_steps = budget_steps
        self.curve = early_stop.curve if early_stop is not None else RunCurve()
        self.started = time.monotonic()

    def point(self, line: str) -> ProgressPoint | None:
        point = parse_progress(line, self.pattern)
        if point is not None and point.step < 0:  # a progress_regex without a step group
            point = replace(point, step=self.count + 1)
        if point is not None:
            self.count += 1
            now = time.monotonic()
            self.meter.add(point.step, point.elapsed_s, now)
            self._add_to_budget_curve(point, now)
        return point

    def _add_to_budget_curve(self, point: ProgressPoint, now: float) -> None:
        if self.budget_steps:
            fraction = point.step / self.budget_steps
        elif self.budget_s:
            seconds = point.elapsed_s if point.elapsed_s is not None else now - self.started
            fraction = seconds / self.budget_s
        else:
            return
        if self.early_stop is not None:
            self.early_stop.add(fraction, point)  # adds the point to self.curve too
        else:
            self.curve.add(fraction, point.loss, float(point.step))

    def __call__(self, line: str) -> None:
        self.point(line)


class LossCurveWriter(ProgressLines):
    """Collects a downsampled loss curve from log lines; writes it to the store every few
    seconds (appending, or rewriting it after a thinning)."""

    def __init__(self, store: Store, exp: Experiment, emit: EventFn,
                 pattern: re.Pattern[str] | None = None, budget_s: float | None = None,
                 early_stop: EarlyStop | None = None, budget_steps: int | None = None) -> None:
        super().__init__(pattern, budget_s, early_stop, budget_steps)
        self.store, self.exp, self.emit = store, exp, emit
        self.step_curve = LossCurve()
        self.points_written = 0  # how many of step_curve.kept the store holds
        self.needs_rewrite = False
        self.last_flush = time.monotonic()

    def __call__(self, line: str) -> None:
        point = self.point(line)
        self.emit("line", self.exp, {"line": line, "point": point})
        if point is None:
            return
        if self.step_curve.add(point):
            self.needs_rewrite = True
        if time.monotonic() - self.last_flush > FLUSH_EVERY_S:
            self.flush()

    def flush(self, final: bool = False) -> None:
        """Write new points; after a thinning (or at the end, with the last point) rewrite."""
        self.last_flush = time.monotonic()
        points = self.step_curve.points(with_last=final)
        try:
            if self.needs_rewrite or (final and len(points) > len(self.step_curve.kept)):
                self.store.replace_loss_points(self.exp.id, points)
            elif len(points) > self.points_written:
                self.store.add_loss_points(self.exp.id, points[self.points_written:])
        except StoreError as exc:
            if final or not exc.out_of_space:
                raise
            return  # no space mid-run: the points wait for the next flush (the last is held)
        self.points_written, self.needs_rewrite = len(self.step_curve.kept), False


class TrainingRuns:
    def __init__(self, store: Store, runner: Runner, settings: LoopSettings, emit: EventFn) -> None:
        self.store, self.runner, self.settings, self.emit = store, runner, settings, emit

    def run(
        self, sweep: Sweep, exp: Experiment, wt: Path, stop: threading.Event, spec: RunSpec
    ) -> tuple[RunResult, bool, Run]:
        """Run the target's command in the worktree as one run record.

        Returns (result, whether training started, the ended run). The experiment's own first
        run owns its log path and loss curve; later runs (confirmations, incumbent re-runs)
        get their own log file beside it.
        """
        config = sweep.config
        k = len(self.store.list_runs(experiment_id=spec.experiment_id))
        is_first_run = spec.experiment_id == exp.id and k == 0
        logs = self.settings.work_dir / "logs" / sweep.name
        log_name = f"{exp.id}.log" if is_first_run else f"{spec.experiment_id}.run{k + 1}.log"
        log_path = logs / log_name
        for folder in (self.settings.work_dir, log_path.parent.parent, log_path.parent):
            _make_private_dir(folder)
        run = self.store.start_run(
            replace(spec, log_path=str(log_path), device=self.settings.device)
        )
        # The run id carries the executing experiment (recovery kills by it); the experiment id
        # names the one whose commit runs (the best's, for an incumbent re-run).
        env = self.env(sweep, exp, spec.seed, run=0 if is_first_run else run.id)
        env["OVERNIGHT_EXPERIMENT_ID"] = str(spec.experiment_id)
        env[CHECKPOINT_ENV] = str(fresh_checkpoint_dir(wt))
        pattern = re.compile(config.progress_regex) if config.progress_regex else None
        run_stop = RunStop(stop)  # its own: an early stop is not the experiment's cancel
        early_stop = self.make_early_stop(sweep, exp, spec, run_stop)
        writer: LossCurveWriter | None = None
        seconds, steps = budget_parts(config)
        lines = ProgressLines(pattern, seconds, early_stop, steps)
        if is_first_run:
            self.store.mark_started(exp.id, log_path=str(log_path), run_started_at=utcnow())
            writer = lines = LossCurveWriter(self.store, exp, self.emit, pattern,
                                             seconds, early_stop, steps)
            self.emit("started", self.store.get_experiment(exp.id), {"budget_s": seconds})
        else:
            self.emit("confirming", exp, {"run": k + 1, "role": spec.role.value})

        def on_start(pid: int, pgid: int) -> None:
            try:
                self.store.set_run_pgid(run.id, pgid)
                if is_first_run:
                    self.store.mark_started(exp.id, pgid=pgid)
            except StoreError as exc:
                if not exc.out_of_space:
                    raise
                logger.warning("run %d: its process group %d is not recorded (no space); a "
                               "restart still finds it by its run id", run.id, pgid)

        def on_submit(job_id: str) -> None:
            try:
                self.store.set_run_job(run.id, job_id)
            except StoreError as exc:
                if not exc.out_of_space:
                    raise
                logger.warning("run %d: its Slurm job %s is not recorded (no space)", run.id,
                               job_id)

        try:
            result = self.runner.run(
                self.argv(config, wt),
                cwd=wt / config.workdir,
                log_path=log_path,
                timeout_s=config.timeout_s,
                env=env,
                pass_env=config.pass_env,
                on_start=on_start,
                on_line=sealed_lines(lines, config.holdout_metric),
                stop_event=run_stop,
                on_submit=on_submit,
            )
            if salvageable(result, config, wt):
                result = self.rerun_evaluation(exp, config, wt, result, env, on_start, stop)
            result, holdout = seal_result(result, config.holdout_metric)
        except (WorkerLostError, OutOfSpaceError):  # no result: the machine or the disk went
            self.store.end_run(run.id, RunEnd(RunStatus.INTERRUPTED))
            raise
        except RunNotStartedError as exc:  # the executor never started it: nothing to judge
            self.store.end_run(run.id, RunEnd(RunStatus.CANCELLED, note=str(exc)[:500]))
            raise
        finally:
            if writer is not None:
                writer.flush(final=True)
        ended = self.record_end(exp, run, result, config, lines, early_stop, holdout)
        return result, writer is None or writer.count > 0, ended

    def record_end(self, exp: Experiment, run: Run, result: RunResult, config: TargetConfig,
                   lines: ProgressLines, early_stop: EarlyStop | None,
                   holdout: float | None = None) -> Run:
        """The run's end with its curve (and sealed holdout); `pruned` when its early stop
        ended it."""
        end = replace(run_end(result, config.metric, lines.meter),
                      curve=lines.curve.points() or None, holdout=holdout)
        if (early_stop is not None and early_stop.stopping_check is not None
                and result.outcome is Outcome.STOPPED):
            end = pruned_end(end, early_stop, budget_parts(config)[0])
            self.emit("pruned", exp, {"reason": end.note, "run": run.id})
        return self.store.end_run(run.id, end)

    def make_early_stop(self, sweep: Sweep, exp: Experiment, spec: RunSpec,
                        run_stop: threading.Event) -> EarlyStop | None:
        """The early stop of a change's own run, with the incumbent's curves read now (the
        commit the change was built on); None for any other run or with `prune = "off"`."""
        if sweep.config.prune != "auto" or exp.is_baseline:
            return None
        base = self.store.get_experiment(exp.id).base_commit or sweep.best_commit
        if not may_stop_early(sweep, exp, spec, base):
            return None
        now = self.store.get_sweep(sweep.name)
        # The best's runs (its own, its re-runs, those paired with changes) are recorded under the
        # experiment that made it: one experiment's runs, not the sweep's thousands.
        runs = (self.store.list_runs(experiment_id=now.best_experiment_id)
                if now.best_commit == base and now.best_experiment_id is not None
                else self.store.list_runs(sweep_id=sweep.id))
        policy = sweep.config.early_stop_policy()
        earlier = earlier_curves(self.store, sweep.id, base)
        rule = Rule.of(sweep.config)
        level = stop_level(rule)
        speed = rule.tolerance(sweep_speed_noise(
            [r for r in self.store.run_metrics(sweep.id) if r.status in USABLE]))
        return EarlyStop(build_reference(exp, runs, spec.seed, base, sweep.config.budget_s,
                                         level, speed, policy=policy, earlier=earlier), run_stop)

    def rerun_evaluation(self, exp: Experiment, config: TargetConfig, wt: Path,
                       first: RunResult, env: dict[str, str],
                       on_start: Callable[[int, int], None],
                       stop: threading.Event) -> RunResult:
        """Training finished and its evaluation crashed: run `eval_command` once on the saved
        checkpoint (its own log beside the run's); the run as it is to be recorded."""
        self.emit("evaluating", exp, {"error": first.error})
        assert config.eval_command is not None
        rerun = self.runner.run(
            self.argv(config, wt, command=config.eval_command),
            cwd=wt / config.workdir,
            log_path=first.log_path.with_name(first.log_path.stem + EVAL_LOG_SUFFIX),
            timeout_s=config.timeout_s,
            env={**env, RETRY_ENV: "1"},
            pass_env=config.pass_env,
            on_start=on_start,
            stop_event=stop,
        )
        return merged(first, rerun, config.metric)

    def argv(self, config: TargetConfig, wt: Path, command: str | None = None) -> list[str]:
        """The target's command (or `command`, without the args file's flags), inside the
        bwrap sandbox when the target asks for it."""
        try:
            argv = (resolve_command(command) if command is not None
                    else resolve_command(config.command) + extra_args(config, wt))
        except ConfigError as exc:  # a change broke the args file: the run fails, saying why
            argv = [sys.executable, "-c", f"raise SystemExit({str(exc)!r})"]
        if config.sandbox != "bwrap":
            return argv
        work = Path(self.settings.work_dir).resolve()
        private = []
        if work.name.endswith(".work"):  # <db>.work: the database's files sit beside it
            db = work.with_name(work.name.removesuffix(".work"))
            private = [db.with_name(db.name + s) for s in ("", "-wal", "-shm", ".token", ".lock")]
        caches = [Path(self.settings.env[k]) for k in CACHE_ENV if k in self.settings.env]
        for cache in caches:
            cache.mkdir(parents=True, exist_ok=True)
        wrapped = bwrap_command(argv, writable=wt.resolve(), hidden_dirs=[work],
                                hidden_files=private, also_writable=caches,
                                network=config.sandbox_network)
        at = wrapped.index("--chdir") + 1  # the target's workdir, not the worktree's root
        wrapped[at] = str((wt / config.workdir).resolve())
        return wrapped

    def env(self, sweep: Sweep, exp: Experiment, seed: int, run: int = 0) -> dict[str, str]:
        config = sweep.config
        env = {
            **config.budget_env(),
            "OVERNIGHT_SEED": str(seed),
            "OVERNIGHT_EXPERIMENT_ID": str(exp.id),
            RUN_ID_ENV: run_id_prefix(self.settings.work_dir, exp.id) + str(run),
            **self.settings.env,
        }
        if self.settings.device:
            env["OVERNIGHT_DEVICE"] = self.settings.device
        return env


def run_end(result: RunResult, metric_key: str, meter: ProgressMeter | None = None) -> RunEnd:
    """How a run ended, as a record: status, metric, throughput (from the summary, else the
    progress lines) and its source, training vs total seconds."""
    raw = result.summary.get(metric_key)
    metric = float(raw) if isinstance(raw, int | float) else None
    if result.outcome is Outcome.STOPPED:
        status = RunStatus.CANCELLED
    elif result.outcome is Outcome.TIMED_OUT:
        status = RunStatus.TIMEOUT
    elif result.ok and metric is not None and math.isfinite(metric):
        status = RunStatus.OK
    else:
        status = RunStatus.FAILED
    found = speed(result.summary, meter)
    return RunEnd(
        status,
        metric=metric if metric is not None and math.isfinite(metric) else None,
        summary=dict(result.summary),
        throughput=found.value,
        throughput_unit=found.unit,
        throughput_source=found.source,
        training_s=_seconds(result.summary.get("training_seconds")),
        total_s=_seconds(result.summary.get("total_seconds")),
    )


def budget_parts(config: TargetConfig) -> tuple[float | None, int | None]:
    """What a run's fraction of its budget is measured against: (seconds, None) on a time
    budget, (None, steps) on a budget of steps, (None, None) on one of tokens."""
    return (config.budget_s if config.time_budget else None), config.budget_steps


def pruned_end(end: RunEnd, early_stop: EarlyStop, budget_s: float | None) -> RunEnd:
    """A run the early stop ended: `pruned`, no metric, why in its note, the training seconds
    it had when stopped (its summary's; else its last line's elapsed seconds, as on a budget
    of steps; else its share of a time budget)."""
    check = early_stop.stopping_check
    assert check is not None
    seconds = end.training_s or early_stop.elapsed_s
    if seconds is None and budget_s:
        seconds = round(early_stop.curve.last_fraction * budget_s, 3)
    return replace(end, status=RunStatus.PRUNED, metric=None, note=check.reason(),
                   stop_fraction=check.fraction, training_s=seconds)


def stop_point(run: Run, budget_s: float | None = None) -> StopPoint:
    """Where an early stop ended `run` (its experiment's record keeps it): its id, the fraction
    of the budget (its check's, else its training seconds') and the step of its curve's last
    point."""
    fraction = run.stop_fraction
    if fraction is None and run.training_s is not None and budget_s:
        fraction = round(run.training_s / budget_s, 3)
    return StopPoint(run.id, fraction, int(run.curve[-1][2]) if run.curve else None)


def sealed_lines(on_line: Callable[[str], None], key: str | None) -> Callable[[str], None]:
    """`on_line` that never hears the holdout's value (the live view, the dashboard)."""
    if not key:
        return on_line
    return lambda line: on_line(redact(line, key))


def seal_result(result: RunResult, key: str | None) -> tuple[RunResult, float | None]:
    """The result without the holdout metric (summary, log tail and the log files on disk,
    the evaluation's too) and the holdout's value, for the run record alone."""
    if not key:
        return result, None
    summary, value = seal_summary(result.summary, key)
    eval_log = result.log_path.with_name(result.log_path.stem + EVAL_LOG_SUFFIX)
    for path in {result.log_path, eval_log}:
        _redact_file(path, key)
    return replace(result, summary=summary, log_tail=redact(result.log_tail, key),
                   error=redact(result.error, key) if result.error else result.error), value


def _redact_file(path: Path, key: str) -> None:
    """Rewrite a log in place (its mode kept) with the holdout's lines sealed."""
    try:
        data = path.read_bytes()
    except OSError:
        return
    sealed = redact_bytes(data, key)
    if sealed == data:
        return
    tmp = path.with_name(path.name + ".sealing")
    try:
        tmp.write_bytes(sealed)
        os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except OSError:
        logger.warning("could not seal the holdout lines of %s", path)
        tmp.unlink(missing_ok=True)


def _seconds(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _make_private_dir(folder: Path) -> None:
    """The work and log folders are the service's own: 0700 whether new or not."""
    folder.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    os.chmod(folder, DIR_MODE)
