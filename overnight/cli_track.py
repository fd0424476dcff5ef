"""The night in the trackers labs read: `--track mlflow|wandb|none` for `overnight run` and
`serve`, `overnight export --sweep NAME --to mlflow|wandb` (a finished sweep back-filled),
and the lines that say how far behind a tracker is (agent.ops.track)."""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import ValidationError

from agent.core.domain import Sweep, SweepStatus
from agent.core.errors import ConfigError
from agent.core.tracking import TrackTable, dashboard_url, tracker_name
from agent.ops.track import OFF, Choice, make_tracker
from agent.ops.track_record import TrackerError
from db.reads import Reads
from overnight.cli_common import DbOpt, app, console, fail, runtime_for

TrackOpt = Annotated[str | None, typer.Option(
    "--track", help="mirror the night to an experiment tracker: mlflow | wandb (set up by its "
    "own variables: MLFLOW_TRACKING_URI, WANDB_PROJECT, WANDB_MODE, …) | none (not even a "
    "sweep's \\[track]); default: each sweep's \\[track] table")]


def track_choice(value: str | None) -> Choice:
    """--track as the mirror's choice; ConfigError naming the choices for anything else."""
    if value is None:
        return None
    if value.strip().lower() in ("none", "off"):
        return OFF
    try:
        return TrackTable(to=value)
    except ValidationError:
        raise ConfigError(f"--track: unknown tracker {value!r} (use mlflow, wandb or "
                          "none)") from None


def ready(choice: Choice, own: TrackTable | None) -> str | None:
    """Make the tracker the night will use now (its package imported, its variables read):
    where it writes, or None when nothing is mirrored; ConfigError when it cannot be made."""
    table = None if choice == OFF else choice if isinstance(choice, TrackTable) else own
    if table is None:
        return None
    try:
        return make_tracker(table).destination
    except TrackerError as exc:
        raise ConfigError(str(exc)) from None


def print_progress(reads: Reads, sweep: Sweep) -> None:
    """One line per tracker holding the sweep; how to catch up one left behind."""
    for p in reads.track_progress(sweep.id):
        console.print(f"tracker {p.line()}", soft_wrap=True, markup=False)
        if not p.up_to_date:
            kind = p.destination.split()[0]
            console.print(f"  back-fill it: overnight export --sweep {sweep.name} --to {kind}",
                          soft_wrap=True, markup=False)


@app.command()
def export(
    sweep: Annotated[str, typer.Option(help="the sweep to back-fill")],
    to: Annotated[str, typer.Option("--to", help="mlflow | wandb")],
    experiment: Annotated[str | None, typer.Option(
        help="MLflow's experiment or W&B's project (default: the sweep's \\[track] one, else "
        "$MLFLOW_EXPERIMENT_NAME / $WANDB_PROJECT, else overnight)")] = None,
    dashboard: Annotated[str | None, typer.Option(
        "--dashboard-url", help="where the dashboard answers, for each run's link (default: "
        "the sweep's \\[track] one, else http://127.0.0.1:8000)")] = None,
    db: DbOpt = None,
) -> None:
    """Back-fill a finished sweep into MLflow or W&B: what the tracker lacks of it, never twice."""
    try:
        kind = tracker_name(to)
    except ValueError as exc:
        fail(f"--to: {exc}")
    try:
        link = dashboard_url(dashboard) if dashboard else None
    except ValueError as exc:
        fail(f"--dashboard-url: {exc}")
    rt = runtime_for(db)
    found = rt.store.get_sweep(sweep)
    if found.status is SweepStatus.RUNNING:
        fail(f"sweep {sweep} is running: export a finished or paused sweep (a running night "
             "is mirrored by --track or its [track] table)")
    own = found.config.track if found.config.track and found.config.track.to == kind else None
    table = TrackTable(to=kind, experiment=experiment or (own.experiment if own else None),
                       dashboard_url=link or (own.dashboard_url if own else None))
    mirror = rt.make_mirror(table)
    where = kind
    try:
        where = mirror.tracker_for(table).destination
        done = mirror.export(sweep)
    except TrackerError as exc:
        fail(f"export of sweep {sweep} to {where}: {exc}")
    finally:
        for tracker in mirror.trackers.values():
            tracker.close()
    console.print(f"sweep {sweep} → {where}: {done.logged} experiment(s) logged, "
                  f"{done.updated} verdict(s) updated"
                  f"{', the sweep closed' if done.closed else ''}", soft_wrap=True, markup=False)
    print_progress(rt.reads, found)
