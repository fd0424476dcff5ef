"""`overnight doctor`: run a target's unmodified HEAD at a short budget and check its contract.

Runs the command twice, with seeds seed and seed + 1 as a sweep's baseline does, in a throw-away
worktree (assets linked as for a sweep), outside any database; the checks themselves are
agent.rules.contract's and agent.rules.repeats' pure functions (is the seed used, where does
the throughput come from).
"""

from __future__ import annotations

import re
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agent.core.config import TargetConfig
from agent.git.repo import GitRepo
from agent.ops.sweeps import asset_hashes, dirty_files, link_assets
from agent.proposers.knob_sources import find_knobs
from agent.rules.blocking import Sample
from agent.rules.contract import (
    Check,
    RunFacts,
    check_evaluation,
    check_noise,
    check_run,
)
from agent.rules.repeats import check_seed, check_speed
from agent.rules.throughput import ProgressMeter, speed
from runner.process import resolve_command, run_command
from runner.result import Outcome, RunResult
from runner.summary import parse_progress

DOCTOR_BUDGET_S = 20.0


@dataclass(frozen=True)
class Diagnosis:
    checks: list[Check]
    runs: list[RunResult]

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)


def facts_of(result: RunResult, progress_points: int) -> RunFacts:
    return RunFacts(timed_out=result.outcome is Outcome.TIMED_OUT, exit_code=result.exit_code,
                    wall_s=result.wall_s, summary=result.summary,
                    progress_points=progress_points, error=result.error)


def _run_once(config: TargetConfig, worktree: Path, log: Path, seed: int
              ) -> tuple[RunResult, int, Sample | None]:
    """One run: its result, how many progress lines parsed, and (with a metric) its sample."""
    pattern = re.compile(config.progress_regex) if config.progress_regex else None
    meter = ProgressMeter()

    def on_line(line: str) -> None:
        point = parse_progress(line, pattern)
        if point is not None:
            meter.add(point.step if point.step >= 0 else meter.lines + 1, point.elapsed_s,
                      time.monotonic())

    env = {"OVERNIGHT_BUDGET_S": f"{config.budget_s:g}", "OVERNIGHT_SEED": str(seed),
           "OVERNIGHT_EXPERIMENT_ID": "doctor"}
    result = run_command(resolve_command(config.command), cwd=worktree / config.workdir,
                         log_path=log, timeout_s=config.timeout_s, env=env, grace_s=2.0,
                         on_line=on_line)
    metric, found = _metric(result, config), speed(result.summary, meter)
    got = None if metric is None else Sample(metric, found.value, seed=seed, source=found.source)
    return result, meter.lines, got


def command_overrides(config: TargetConfig, files: dict[str, str]) -> list[Check]:
    """A flag in the protected command silently beats the editable default a proposal edits."""
    words = set(shlex.split(config.command))
    knobs = [k for path, text in files.items() for k in find_knobs(path, text) if k.flag]
    hit = sorted({k.flag for k in knobs if k.flag in words or any(
        w.startswith(k.flag + "=") for w in words)})
    if not hit:
        return []
    return [Check("command flags", "warn",
                  f"`{config.command}` sets {', '.join(hit)}: changes to those defaults in the "
                  "editable files have no effect",
                  "drop those flags from `command` and put the values in the argparse defaults")]


def static_checks(repo: GitRepo, config: TargetConfig) -> list[Check]:
    head = repo.head("HEAD")
    files = {p: repo.read_file(head, p) for p in config.editable
             if repo.file_hashes(head, [p])[p] != "missing"}
    dirty = dirty_files(repo, config)
    checks = [Check("checkout committed", "warn" if dirty else "ok",
                    f"uncommitted: {', '.join(dirty)}" if dirty else "nothing uncommitted",
                    "commit them: runs use committed files only" if dirty else "")]
    return [*checks, check_evaluation(config, files), *command_overrides(config, files)]


def diagnose(target: Path, config: TargetConfig, runs: int = 2) -> Diagnosis:
    """Static checks, then `runs` runs of HEAD (stopping after a first run that failed)."""
    repo = GitRepo(target)
    checks = static_checks(repo, config)
    asset_hashes(repo, target, repo.head("HEAD"), config)  # a missing asset: ConfigError now
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="overnight-doctor-") as tmp:
        worktree = Path(tmp) / "wt"
        repo.add_worktree(worktree, repo.head("HEAD"))
        try:
            link_assets(worktree, target, config)
            first, points, one = _run_once(config, worktree, Path(tmp) / "run1.log", config.seed)
            results.append(first)
            checks += check_run(config, facts_of(first, points))
            if runs > 1 and not any(c.status == "fail" for c in checks):
                second, _, two = _run_once(config, worktree, Path(tmp) / "run2.log",
                                           config.seed + 1)
                results.append(second)
                metrics = [_metric(r, config) for r in results]
                if metrics[1] is None:
                    why = "timed out" if second.outcome is Outcome.TIMED_OUT else (
                        second.error or f"exit code {second.exit_code}")
                    checks.append(Check("noise", "warn", f"the second run printed no "
                                        f"{config.metric} ({why}) although the first did",
                                        "a run that fails only sometimes: read its log"))
                else:
                    pair = [s for s in (one, two) if s is not None]
                    checks += [check_seed(pair, config.metric),
                               *check_noise(config, metrics[0], metrics[1]), check_speed(pair)]
            elif one is not None:
                checks.append(check_speed([one]))
        finally:
            repo.remove_worktree(worktree)
    return Diagnosis(checks, results)


def _metric(result: RunResult, config: TargetConfig) -> float | None:
    value = result.summary.get(config.metric)
    return float(value) if isinstance(value, int | float) else None
