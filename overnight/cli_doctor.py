"""`overnight doctor` (the script contract, checked by running it) and the baseline's hints.

Registers its commands on `overnight.cli_common.app` when imported (overnight.cli imports it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from agent.core.config import load_config
from agent.core.domain import ExperimentStatus, Sweep
from agent.core.ports import Store
from agent.rules.contract import Check, RunFacts, check_run
from db.reads import Reads
from overnight.cli_common import DbOpt, app, console, db_location, fail, work_dir_of

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
    budget: Annotated[float, typer.Option(help="training seconds for the check runs")] = 20.0,
    timeout: Annotated[float | None, typer.Option(help="hard kill per run (default 4x budget, "
                                                  "at least budget + 120)")] = None,
    runs: Annotated[int, typer.Option(min=1, max=5, help="runs of HEAD (2 measure noise)")] = 2,
    db: DbOpt = None,
) -> None:
    """Run the target's HEAD at a short budget and print a checklist of the script contract
    and of every knob (where it is set, whether a change to it reaches the run)."""
    from agent.core.errors import ConfigError
    from agent.ops.doctor import diagnose

    # Generous: a slow start-up on a busy machine is a finding to report, not a run to kill.
    config = load_config(target).with_budget(budget, timeout or max(budget * 4, budget + 120))
    console.print(f"doctor: {runs} run(s) of {target} HEAD at a {config.budget_s:g} s budget "
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


def baseline_checks(reads: Reads, sweep: Sweep) -> list[Check]:
    """The cheap contract checks on a sweep's baseline record; only what went wrong."""
    base = next((e for e in reads.store.list_experiments(sweep.id) if e.is_baseline), None)
    if base is None or not base.status.is_finished() or base.status is ExperimentStatus.CANCELLED:
        return []
    wall = ((base.run_ended_at - base.run_started_at).total_seconds()
            if base.run_started_at and base.run_ended_at else 0.0)
    facts = RunFacts(timed_out=base.status is ExperimentStatus.TIMEOUT, exit_code=None,
                     wall_s=wall, summary=base.summary,
                     progress_points=len(reads.loss_points(base.id)),
                     error=base.reason if base.status is ExperimentStatus.CRASHED else None)
    checks = [*check_run(sweep.config, facts), *repeat_checks(reads.store, sweep, base.id)]
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
