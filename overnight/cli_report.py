"""`overnight report` (the morning report as Markdown or one self-contained HTML file) and
`overnight finalize` (the kept chain as a branch to merge, and with --ablate the attribution of
the night's gain to each kept change).

Registers its commands on `overnight.cli_common.app` when imported (overnight.cli imports it).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from agent.analysis.ablation import DEFAULT_SEEDS
from overnight.cli_common import (
    DbOpt,
    DevicesOpt,
    SlotsOpt,
    WorkDirOpt,
    app,
    console,
    db_location,
    fail,
    runtime_for,
    slots_and_devices,
)

FORMATS = ("md", "html")


@app.command()
def report(
    sweep: Annotated[str, typer.Option(help="sweep name")],
    format: Annotated[str, typer.Option("--format", help="md | html (one self-contained "
                                        "page, the progress plot inlined)")] = "md",
    output: Annotated[Path | None, typer.Option(help="write it to this file (default: "
                                                "stdout)")] = None,
    db: DbOpt = None,
) -> None:
    """The morning report of a sweep: headline, kept changes with their evidence, what was
    learned, crashes, cost, the attribution of an ablation and what to try next."""
    from agent.core.errors import NotFoundError

    if format not in FORMATS:
        fail(f"--format must be md or html, got {format!r}")
    store = runtime_for(db).store
    try:
        text = report_text(store, sweep, format)
    except NotFoundError as exc:
        fail(str(exc))
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.expanduser().write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"--output {output}: {exc.strerror or exc}")
    console.print(f"report of sweep {sweep} written to {output}", soft_wrap=True)


def report_text(store, sweep: str, fmt: str) -> str:  # type: ignore[no-untyped-def]
    """The report of `sweep` as Markdown or HTML."""
    from agent.analysis.morning_md import render_markdown
    from agent.ops.morning import report_of

    model = report_of(store, sweep)
    if fmt == "html":
        from api.dashboard.report_html import render_html

        return render_html(model)
    return render_markdown(model)


@app.command()
def finalize(
    sweep: Annotated[str, typer.Option(help="sweep name")],
    ablate: Annotated[bool, typer.Option(help="also run the best minus each kept change "
                                         "(--seeds runs each) and attribute the gain")] = False,
    seeds: Annotated[int, typer.Option(min=2, max=20, help="with --ablate: runs per variant, "
                                       "seeds seed … seed+k−1 for every variant")]
    = DEFAULT_SEEDS,
    budget: Annotated[float | None, typer.Option(help="with --ablate: training seconds per "
                                                 "run (default: the sweep's)")] = None,
    device: Annotated[str | None, typer.Option(help="with --ablate: OVERNIGHT_DEVICE for the "
                                               "script")] = None,
    slots: SlotsOpt = None,
    devices: DevicesOpt = None,
    db: DbOpt = None,
    work_dir: WorkDirOpt = None,
) -> None:
    """The kept chain as a new branch (one commit per kept change on the baseline, each with its
    evidence); the sweep's and your branches do not move. --ablate: leave-one-out runs that
    attribute the night's gain to each kept change."""
    from agent.core.errors import OvernightError
    from agent.engine.scheduler import SchedulerSettings
    from agent.ops.finalize import finalize as replay
    from agent.ops.finalize import prepare_ablation
    from overnight.cli_foreground import drive_locked
    from overnight.cli_results import find_sweep
    from overnight.runtime import open_target

    rt = runtime_for(db, work_dir)
    found = find_sweep(rt.store, sweep, None, db_location(db))
    if ablate:  # the lock before anything is made: a busy database changes nothing
        n_slots, on = slots_and_devices(slots, devices)
        rt.hold_lock(hint=" (finalize --ablate runs the variants itself; stop that process, "
                     "or finalize without --ablate)")
        rt.recover()
    try:
        repo = open_target(Path(found.target_path))
        if not found.status.is_finished():
            console.print(f"sweep {found.name} is {found.status.value}: this is its kept chain "
                          "as of now")
        done = replay(rt.store, repo, found)
        print_finalized(done, found)
        if not ablate:
            return
        abl = prepare_ablation(rt.store, repo, found, done, seeds, budget)
        variants = abl.max_experiments or 0
        console.print(f"ablation sweep [bold]{abl.name}[/bold]: the best and {variants} "
                      f"variant(s), {seeds} seeds each ({(variants + 1) * seeds} runs at most)")
        settings = SchedulerSettings(slots=n_slots, devices=on, device=device)
        drive_locked(rt, abl, settings)
    except OvernightError as exc:
        fail(str(exc))
    finally:
        rt.release_lock()
    print_attribution(rt.store, found.name)


def print_finalized(done, sweep) -> None:  # type: ignore[no-untyped-def]
    from rich.markup import escape

    console.print(f"{len(done.commits)} kept change(s) replayed on the baseline "
                  f"{done.base[:7]} (sweep {sweep.name}; its branch {sweep.branch} did not move):")
    for i, sha in done.commits:
        console.print(f"  {sha[:7]} #{i}", soft_wrap=True)
    console.print(f"merge it with: git merge {escape(done.branch)}", soft_wrap=True)
    console.print(f"branch: [bold]{escape(done.branch)}[/bold]", soft_wrap=True)


def print_attribution(store, name: str) -> None:  # type: ignore[no-untyped-def]
    from agent.analysis.morning_md import attribution_markdown
    from agent.ops.morning import report_of

    found = report_of(store, name).attribution
    if found is None:
        console.print("the ablation did not finish: `overnight report` shows it once it has")
        return
    sys.stdout.write("\n" + attribution_markdown(found) + "\n")
    console.print(f"the full report: overnight report --sweep {name}")
