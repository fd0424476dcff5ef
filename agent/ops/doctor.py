"""`overnight doctor`: run a target's unmodified HEAD at a short budget and check its contract.

Runs the command twice with the same seed in a throw-away worktree (assets linked as for a
sweep), outside any database; the checks themselves are agent.rules.contract's pure functions.
"""

from __future__ import annotations

import re
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

from agent.core.config import TargetConfig, extra_args
from agent.git.repo import GitRepo
from agent.ops.sweeps import asset_hashes, dirty_files, link_assets
from agent.proposers.knob_sources import find_knobs
from agent.rules.contract import (
    Check,
    RunFacts,
    check_evaluation,
    check_noise,
    check_run,
    check_steps,
)
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


def _run_once(config: TargetConfig, worktree: Path, log: Path) -> tuple[RunResult, int]:
    pattern = re.compile(config.progress_regex) if config.progress_regex else None
    points = 0

    def on_line(line: str) -> None:
        nonlocal points
        points += parse_progress(line, pattern) is not None

    env = {"OVERNIGHT_BUDGET_S": f"{config.budget_s:g}", "OVERNIGHT_SEED": str(config.seed),
           "OVERNIGHT_EXPERIMENT_ID": "doctor"}
    argv = resolve_command(config.command) + extra_args(config, worktree)
    result = run_command(argv, cwd=worktree / config.workdir,
                         log_path=log, timeout_s=config.timeout_s, env=env, grace_s=2.0,
                         on_line=on_line)
    return result, points


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
            first, points = _run_once(config, worktree, Path(tmp) / "run1.log")
            results.append(first)
            checks += check_run(config, facts_of(first, points))
            if runs > 1 and not any(c.status == "fail" for c in checks):
                second, _ = _run_once(config, worktree, Path(tmp) / "run2.log")
                results.append(second)
                metrics = [_metric(r, config) for r in results]
                if metrics[1] is None:
                    why = "timed out" if second.outcome is Outcome.TIMED_OUT else (
                        second.error or f"exit code {second.exit_code}")
                    checks.append(Check("noise", "warn", f"the second run printed no "
                                        f"{config.metric} ({why}) although the first did",
                                        "a run that fails only sometimes: read its log"))
                else:
                    checks += check_noise(config, metrics[0], metrics[1])
                    checks += check_steps(first.summary, second.summary)
        finally:
            repo.remove_worktree(worktree)
    return Diagnosis(checks, results)


def _metric(result: RunResult, config: TargetConfig) -> float | None:
    value = result.summary.get(config.metric)
    return float(value) if isinstance(value, int | float) else None
