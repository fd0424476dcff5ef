"""`overnight doctor`: run a target's unmodified HEAD at a short budget and check its contract.

Runs the command twice, with seeds seed and seed + 1 as a sweep's baseline does, in a throw-away
worktree (assets linked as for a sweep), outside any database (with --db its logs are kept in
the database's work folder); the checks themselves are agent.rules.contract's pure functions
(the summary, the budget, is the seed used, where does the throughput come from), the knob
checks and the progress_regex that fits the printed lines agent.ops.doctor_knobs', where the run
imports the repository's own packages from agent.ops.doctor_imports'.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

from agent.core.config import TargetConfig, extra_args
from agent.git.repo import GitRepo
from agent.ops.doctor_imports import (
    ImportFacts,
    check_imports,
    import_facts,
    missing_own_package,
)
from agent.ops.doctor_knobs import (
    ignored_missing,
    knob_checks,
    knob_states,
    printed_values,
    progress_fix,
)
from agent.ops.sweeps import asset_hashes, dirty_files, link_assets
from agent.rules.conditions import Sample
from agent.rules.contract import (
    Check,
    RunFacts,
    check_early_stop,
    check_evaluation,
    check_noise,
    check_run,
    check_seed,
    check_speed,
)
from agent.rules.throughput import ProgressMeter, speed
from runner.process import resolve_command, run_command
from runner.result import Outcome, RunResult
from runner.summary import parse_progress

DOCTOR_BUDGET_S = 20.0


@dataclass(frozen=True)
class Diagnosis:
    checks: list[Check]
    runs: list[RunResult]
    logs: list[Path] = field(default_factory=list)  # kept run logs (with a work_dir)

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)


def facts_of(result: RunResult, progress_points: int) -> RunFacts:
    return RunFacts(timed_out=result.outcome is Outcome.TIMED_OUT, exit_code=result.exit_code,
                    wall_s=result.wall_s, summary=result.summary,
                    progress_points=progress_points, error=result.error)


def _env(config: TargetConfig, seed: int) -> dict[str, str]:
    return {"OVERNIGHT_BUDGET_S": f"{config.budget_s:g}", "OVERNIGHT_SEED": str(seed),
            "OVERNIGHT_EXPERIMENT_ID": "doctor"}


def _run_once(config: TargetConfig, worktree: Path, log: Path, seed: int
              ) -> tuple[RunResult, ProgressMeter, Sample | None]:
    """One run: its result, its progress lines' meter, and (with a metric) its sample."""
    pattern = re.compile(config.progress_regex) if config.progress_regex else None
    meter = ProgressMeter()

    def on_line(line: str) -> None:
        point = parse_progress(line, pattern)
        if point is not None:
            meter.add(point.step if point.step >= 0 else meter.lines + 1, point.elapsed_s,
                      time.monotonic())

    argv = resolve_command(config.command) + extra_args(config, worktree)
    result = run_command(argv, cwd=worktree / config.workdir,
                         log_path=log, timeout_s=config.timeout_s, env=_env(config, seed),
                         grace_s=2.0, on_line=on_line)
    metric, found = _metric(result, config), speed(result.summary, meter)
    got = None if metric is None else Sample(metric, found.value, seed=seed, source=found.source)
    return result, meter, got


def target_files(repo: GitRepo, head: str, config: TargetConfig) -> dict[str, str]:
    """The editable files at HEAD, and the files the command names (config files), for the
    override chain."""
    named = [w for w in shlex.split(config.command) if w.endswith((".py", ".json", ".yaml",
                                                                     ".yml", ".toml"))]
    paths = list(dict.fromkeys([*config.editable, *named]))
    hashes = repo.file_hashes(head, paths)
    return {p: repo.read_file(head, p) for p in paths if hashes[p] != "missing"}


def static_checks(repo: GitRepo, config: TargetConfig) -> list[Check]:
    head = repo.head("HEAD")
    files = target_files(repo, head, config)
    editable = {p: t for p, t in files.items() if p in config.editable}
    dirty = dirty_files(repo, config)
    checks = [Check("checkout committed", "warn" if dirty else "ok",
                    f"uncommitted: {', '.join(dirty)}" if dirty else "nothing uncommitted",
                    "commit them: runs use committed files only" if dirty else "")]
    return [*checks, check_evaluation(config, editable), *knob_checks(config, files)]


def _first_run_checks(target: Path, config: TargetConfig, files: dict[str, str],
                      result: RunResult, meter: ProgressMeter, log: Path,
                      imports: ImportFacts | None) -> list[Check]:
    """check_run and the early stop's check, with the fix for what the log shows (a missing
    git-ignored file, the repository's own package not found, progress lines no regex reads:
    the regex that reads them, which also turns the early stop on), and printed values."""
    checks = check_run(config, facts_of(result, meter.lines))
    hint = ignored_missing(target, config, result.error) or missing_own_package(
        imports, result.error)
    if hint:
        checks = [replace(c, fix=hint) if c.name == "runs" else c for c in checks]
    text = log.read_text(errors="replace") if log.is_file() else ""
    timed = meter.last_timed
    stop = check_early_stop(config, meter.lines, timed.elapsed_s if timed is not None else None)
    failed = any(c.name == "runs" and c.status == "fail" for c in checks)
    progress = progress_fix(files, text.splitlines()) if meter.lines == 0 and not failed \
        else None
    if progress:
        checks = [replace(c, fix=progress) if c.name == "progress lines" else c for c in checks]
        stop = replace(stop, detail=f"{stop.detail}; to turn it on: {progress}", fix=progress)
    return [*checks, *printed_values(knob_states(config, files), text), stop]


def _work_root(work_dir: Path | None, stack: ExitStack) -> Path:
    if work_dir is None:
        return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="overnight-doctor-")))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = Path(work_dir) / "doctor" / f"{stamp}-{os.getpid()}"
    root.mkdir(parents=True, exist_ok=True)
    return root


def diagnose(target: Path, config: TargetConfig, runs: int = 2,
             work_dir: Path | None = None) -> Diagnosis:
    """Static checks, then `runs` runs of HEAD (stopping after a first run that failed).

    With `work_dir` (the database's, from --db), the run logs are kept under
    `<work_dir>/doctor/`; otherwise everything goes in a temporary folder."""
    repo = GitRepo(target)
    checks = static_checks(repo, config)
    head = repo.head("HEAD")
    files = target_files(repo, head, config)
    asset_hashes(repo, target, head, config)  # a missing asset: ConfigError now
    results: list[RunResult] = []
    with ExitStack() as stack:
        tmp = _work_root(work_dir, stack)
        worktree = tmp / "wt"
        repo.add_worktree(worktree, head)
        try:
            link_assets(worktree, target, config)
            imports = import_facts(resolve_command(config.command), worktree / config.workdir,
                                   worktree, _env(config, config.seed), config.command)
            first, meter, one = _run_once(config, worktree, tmp / "run1.log", config.seed)
            results.append(first)
            checks += _import_checks(imports, config, first)
            checks += _first_run_checks(target, config, files, first, meter,
                                        tmp / "run1.log", imports)
            if runs > 1 and not any(c.status == "fail" for c in checks):
                second, _, two = _run_once(config, worktree, tmp / "run2.log", config.seed + 1)
                results.append(second)
                checks += _second_run_checks(config, second, [one, two])
            elif one is not None:
                checks.append(check_speed([one]))
        finally:
            repo.remove_worktree(worktree)
    logs = [tmp / f"run{i + 1}.log" for i in range(len(results))] if work_dir else []
    return Diagnosis(checks, results, logs)


def _import_checks(imports: ImportFacts | None, config: TargetConfig,
                   first: RunResult) -> list[Check]:
    """Where the run imports the repository's packages from (a run that already failed for
    want of one says so itself, with the same fix)."""
    found = check_imports(imports, list(config.editable))
    if found is None or (found.status == "fail" and missing_own_package(imports, first.error)):
        return []
    return [found]


def _second_run_checks(config: TargetConfig, second: RunResult,
                       samples: list[Sample | None]) -> list[Check]:
    """Seeds seed and seed + 1: is the seed used, the seed-to-seed noise, the load check."""
    metrics = [s.metric if s is not None else None for s in samples]
    pair = [s for s in samples if s is not None]
    if metrics[1] is None:
        why = "timed out" if second.outcome is Outcome.TIMED_OUT else (
            second.error or f"exit code {second.exit_code}")
        return [Check("noise", "warn", f"the second run printed no {config.metric} ({why}) "
                      "although the first did", "a run that fails only sometimes: read its log")]
    return [check_seed(pair, config.metric), *check_noise(config, metrics[0], metrics[1]),
            check_speed(pair)]


def _metric(result: RunResult, config: TargetConfig) -> float | None:
    value = result.summary.get(config.metric)
    return float(value) if isinstance(value, int | float) else None
