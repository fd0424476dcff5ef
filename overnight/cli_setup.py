"""Setting up a target: `overnight init` (a new target from a template), `overnight adopt PATH`
(an overnight.toml for an existing training repository) and `overnight doctor` (the script
contract, checked by running it), with the baseline's hints a foreground run prints.

Registers its commands on `overnight.cli_common.app` when imported (overnight.cli imports it).
"""

from __future__ import annotations

import shlex
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from statistics import median
from typing import Annotated

import typer
from rich.markup import escape

from agent.core.budget import parse_budget
from agent.core.config import CONFIG_FILE, load_config, parse_config
from agent.core.domain import ExperimentStatus, Sweep
from agent.core.errors import ConfigError
from agent.core.ports import Store
from agent.rules.contract import Check, RunFacts, check_run
from db.reads import Reads
from overnight.cli_common import (
    DbOpt,
    app,
    console,
    db_location,
    fail,
    work_dir_of,
)

# --- init: a new target from a template -------------------------------------------------------
TEMPLATES = Path(__file__).resolve().parent.parent / "experiments"


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="folder for the new target repository")],
    template: Annotated[str, typer.Option(help="template under experiments/")] = "gpt",
) -> None:
    """Create a target repository from a template (a git repo with overnight.toml)."""
    src = TEMPLATES / template
    if not (src / CONFIG_FILE).is_file():
        choices = sorted(p.name for p in TEMPLATES.iterdir() if (p / CONFIG_FILE).is_file())
        fail(f"unknown template {template!r} (available: {', '.join(choices)})")
    init_target(src, path)
    console.print(f"created target [bold]{path}[/bold] from template {template}")
    console.print(f"next: overnight run --target {path} --experiments 20 --budget 300")


def init_target(src: Path, path: Path) -> None:
    from agent.git.repo import init_repo

    if path.exists() and any(path.iterdir()):
        fail(f"{path} exists and is not empty")
    shutil.copytree(
        src,
        path,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "__init__.py"),
    )
    (path / ".gitignore").write_text("__pycache__/\n*.log\n.overnight/\n")
    init_repo(path)


# --- adopt: an overnight.toml for an existing repository --------------------------------------
def _ask(question: str, default: str | None) -> str | None:
    if not sys.stdin.isatty():
        return default
    answer = typer.prompt(question, default=default or "", show_default=bool(default))
    return str(answer).strip() or default


@app.command()
def adopt(
    path: Annotated[Path, typer.Argument(help="an existing git repository with a training script")],
    script: Annotated[str | None, typer.Option(help="the training script (default: found)")] = None,
    metric: Annotated[str | None, typer.Option(help="summary-block key to optimise")] = None,
    direction: Annotated[str | None, typer.Option(help="minimize | maximize")] = None,
    command: Annotated[str | None, typer.Option(help="command run from the repo root")] = None,
    editable: Annotated[list[str] | None, typer.Option(help="a file proposals may change "
                                                       "(repeat the option)")] = None,
    budget: Annotated[float | None, typer.Option(
        help="training seconds per run (default: the probe's training time when it ends by "
             "itself, else 300)")] = None,
    force: Annotated[bool, typer.Option(help=f"overwrite an existing {CONFIG_FILE}")] = False,
    probe: Annotated[float, typer.Option(
        min=0, help="seconds the command may run once to show what it prints (0: no run)")
    ] = 60.0,
) -> None:
    """Find the training entry point and write overnight.toml (asks when run in a terminal)."""
    from agent.git.repo import GitRepo
    from agent.ops.adopt import adopt as inspect_repo
    from agent.ops.adopt import direction_for, render_toml

    root = path.resolve()
    if not (root / ".git").exists():
        fail(f"{root} is not a git repository: run `git -C {shlex.quote(str(root))} init` and "
             "commit your code first")
    if (root / CONFIG_FILE).exists() and not force:
        fail(f"{root / CONFIG_FILE} exists; pass --force to overwrite it")
    from agent.engine.devices import detect_devices

    if probe and not GitRepo(root).has_ref("HEAD"):
        fail(f"{root} has no commit yet: commit your code first (the probe runs HEAD), or pass "
             "--probe 0")
    try:
        found = inspect_repo(root, Path(script) if script else None, command,
                             has_gpu=bool(detect_devices()), metric=metric, probe_s=probe,
                             budget_s=budget)
    except ValueError as exc:
        fail(str(exc))
    if found.args_file and (root / found.args_file).exists() and not force:
        fail(f"{root / found.args_file} exists; pass --force to overwrite it")
    chosen = metric or _ask("metric (a key of the script's summary block)", found.metric)
    if not chosen:
        fail("no metric found in the script; pass --metric NAME (the key it prints after ---)")
    way, why = direction_for(chosen)
    found = replace(found, editable=editable or found.editable, metric=chosen,
                    direction=direction or _ask("direction (minimize/maximize)", way) or way,
                    direction_why="as given" if direction else why)
    text = render_toml(found)
    try:
        import tomllib

        parse_config(tomllib.loads(text)["target"])
    except ConfigError as exc:
        fail(f"the {CONFIG_FILE} adopt would write is invalid: {exc}")
    (root / CONFIG_FILE).write_text(text)
    if found.args_file:
        (root / found.args_file).write_text(found.args_text)
    _report(root, found, text)


def _report(root: Path, found, text: str) -> None:  # type: ignore[no-untyped-def]
    console.print(f"wrote {root / CONFIG_FILE}:\n{text}", soft_wrap=True, markup=False)
    if found.args_file:
        console.print(f"wrote {root / found.args_file} (the command's flags, one a line: a "
                      f"sweep may change their numbers):\n{found.args_text}", soft_wrap=True,
                      markup=False)
    console.print(f"direction = {found.direction}: {escape(found.direction_why)}", soft_wrap=True)
    for note in found.notes:
        console.print(f"- {escape(note)}", soft_wrap=True)
    if len(found.commands) > 1:
        console.print(f"the README runs {found.script} in {len(found.commands)} ways; adopt "
                      f"took `{escape(found.full_command)}` (the first, or on a machine without "
                      "a GPU the first that says cpu); pass --command to choose another",
                      soft_wrap=True)
    console.print(f"{found.knobs} knob(s) will be searched"
                  + (f"; {len(found.dead)} dead (something later sets them)" if found.dead
                     else "")
                  + ("" if found.knobs else f": {escape(found.no_knobs)}"), soft_wrap=True)
    if found.todo:
        console.print(f"\n[bold]{found.script} still needs, for the contract:[/bold] (each "
                      "line goes in verbatim, as it is after `| `)")
        for item in found.todo:
            console.print(f"- {escape(item)}", soft_wrap=True)
    q = shlex.quote(str(root))
    added = " ".join([CONFIG_FILE, *([found.args_file] if found.args_file else [])])
    console.print(f"\nnext: git -C {q} add {added} && git -C {q} commit -m 'overnight "
                  f"target'\n      overnight doctor --target {q}   (lists every knob: where it "
                  "is set, live or dead)", soft_wrap=True)


# --- doctor: the script contract, checked by running it ---------------------------------------
MARK = {"ok": "[green]✓[/green]", "warn": "[yellow]![/yellow]", "fail": "[red]✗[/red]",
        "info": "[blue]·[/blue]"}


def print_checks(checks: list[Check]) -> None:
    for c in checks:
        console.print(f"{MARK[c.status]} {escape(c.name)}: {escape(c.detail)}", soft_wrap=True)
        for knock_on in c.folded:  # what this failure made fail too
            console.print(f"    {escape(knock_on)}", soft_wrap=True)
        if c.fix and c.status in ("warn", "fail"):
            console.print(f"    fix: {escape(c.fix)}", soft_wrap=True)


@app.command()
def doctor(
    target: Annotated[Path, typer.Option(help="target git repository with overnight.toml")],
    budget: Annotated[str, typer.Option(help="training seconds for the check runs, or a "
                                        "compute budget (\"50 steps\")")] = "20",
    timeout: Annotated[float | None, typer.Option(help="hard kill per run (default 4x budget, "
                                                  "at least budget + 120; on a compute "
                                                  "budget the target's)")] = None,
    runs: Annotated[int, typer.Option(min=1, max=5, help="runs of HEAD (2 measure noise)")] = 2,
    db: DbOpt = None,
) -> None:
    """Run the target's HEAD at a short budget and print a checklist of the script contract
    and of every knob (where it is set, whether a change to it reaches the run)."""
    from agent.ops.doctor import diagnose

    try:
        given = parse_budget(budget)
    except ValueError as exc:
        fail(f"--budget: {exc}")
    # Generous: a slow start-up on a busy machine is a finding to report, not a run to kill.
    config = load_config(target).with_budget(given, timeout or (
        max(given * 4, given + 120) if isinstance(given, float) else None))
    console.print(f"doctor: {runs} run(s) of {target} HEAD at a {config.budget_text} budget "
                  f"(timeout {config.timeout_s:g} s): {escape(config.command)}", soft_wrap=True)
    work = work_dir_of(db_location(db), None) if db is not None else None
    try:
        result = diagnose(target.resolve(), config, runs=runs, work_dir=work)
    except ConfigError as exc:
        fail(str(exc))
    print_checks(result.checks)
    for log in result.logs:
        console.print(f"log: {log}", soft_wrap=True)
    bad = sum(c.status == "fail" for c in result.checks)
    warned = sum(c.status == "warn" for c in result.checks)
    console.print(f"{bad} failed, {warned} warning(s)")
    if bad:
        raise typer.Exit(1)


# Endings without a run's output to check: never started, cancelled, refused, interrupted.
NO_OUTPUT = (ExperimentStatus.CANCELLED, ExperimentStatus.REJECTED, ExperimentStatus.INTERRUPTED)


def baseline_checks(reads: Reads, sweep: Sweep) -> list[Check]:
    """The cheap contract checks on a sweep's baseline record (its last that ran: one the
    executor never started, one cancelled or interrupted has no output to check); only what
    went wrong."""
    ran = [e for e in reads.store.list_experiments(sweep.id) if e.is_baseline
           and e.status.is_finished() and e.status not in NO_OUTPUT]
    if not ran:
        return []
    base = ran[-1]
    # one run's wall time, as the summary's training_seconds is one run's (the experiment's
    # span covers all its runs: five baseline runs read as 80 % overhead)
    walls = [(r.ended_at - r.started_at).total_seconds()
             for r in reads.store.list_runs(experiment_id=base.id)
             if r.started_at and r.ended_at]
    facts = RunFacts(timed_out=base.status is ExperimentStatus.TIMEOUT, exit_code=None,
                     wall_s=median(walls) if walls else 0.0, summary=base.summary,
                     progress_points=len(reads.loss_points(base.id)),
                     error=base.reason if base.status is ExperimentStatus.CRASHED else None)
    checks = [*check_run(sweep.config, facts), *repeat_checks(reads.store, sweep, base.id)]
    if facts.error:
        from agent.ops.doctor import missing_dependency  # doctor's imports, only when needed
        hint = missing_dependency(sweep.config, facts.error, Path(sweep.target_path))
        if hint:
            checks = [replace(c, fix=hint) if c.name == "runs" else c for c in checks]
    return [c for c in checks if c.status in ("warn", "fail")]


def repeat_checks(store: Store, sweep: Sweep, baseline_id: int) -> list[Check]:
    """What the baseline's repeats say: is the seed used, can the load be checked."""
    from agent.engine.gather import sample
    from agent.rules.contract import check_seed, check_speed

    runs = [sample(r) for r in store.list_runs(experiment_id=baseline_id)
            if r.metric is not None]
    if not runs:
        return []
    checks = [check_speed(runs, tolerance=10.0)]  # the swing is the keep rule's to handle
    return [check_seed(runs, sweep.metric), *checks] if len(runs) > 1 else checks


def print_baseline_hints(reads: Reads, sweep: Sweep) -> None:
    checks = baseline_checks(reads, sweep)
    if checks:
        console.print(f"\n[bold]the baseline and the script contract[/bold] (`overnight doctor "
                      f"--target {escape(sweep.target_path)}` checks it in full):", soft_wrap=True)
        print_checks(checks)
