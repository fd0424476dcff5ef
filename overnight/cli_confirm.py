"""`overnight confirm --sweep NAME --at budget=1800` (and `overnight run --confirm-at`): re-run a
night's baseline and best at a larger setting, k seeds each on the slots, and say whether the
gain holds, shrinks or flips.

Its own command (not a `finalize` flag): a confirmation needs no new branch, can be asked again
at another setting the next day, and `run --confirm-at` ends a night with it. Registers on
`overnight.cli_common.app` when imported (overnight.cli imports it).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from agent.analysis.confirm import DEFAULT_SEEDS
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

if TYPE_CHECKING:
    from agent.analysis.confirm import ConfirmAt
    from agent.core.domain import Sweep
    from agent.core.ports import Store

AT_HELP = ("the larger setting: budget=SECONDS, device=NAME (OVERNIGHT_DEVICE) or a size "
           "knob NAME=VALUE (the same one-line change to the baseline and to the best)")
CONFIRM_SEEDS = DEFAULT_SEEDS
SeedsOpt = Annotated[int, typer.Option(min=2, max=20, help="runs of the baseline and of the "
                                       "best each, seeds seed … seed+k−1")]


@app.command()
def confirm(
    sweep: Annotated[str, typer.Option(help="sweep name")],
    at: Annotated[str, typer.Option(help=AT_HELP)],
    seeds: SeedsOpt = DEFAULT_SEEDS,
    slots: SlotsOpt = None,
    devices: DevicesOpt = None,
    db: DbOpt = None,
    work_dir: WorkDirOpt = None,
) -> None:
    """Re-run the baseline and the best at a larger setting and say whether the gain holds,
    shrinks or flips (recorded as a confirmation sweep; `overnight report` shows it)."""
    from agent.analysis.confirm import parse_at
    from agent.core.errors import ConfigError

    try:
        setting = parse_at(at)
    except ConfigError as exc:
        fail(str(exc).replace("--confirm-at", "--at"))
    confirm_sweep(db, work_dir, sweep, setting, seeds, slots, devices)


def confirm_sweep(db: str | None, work_dir: Path | None, name: str, at: ConfirmAt,
                  seeds: int, slots: int | None, devices: str | None) -> None:
    """Hold the lock, build the confirmation sweep of `name` at `at`, run it, print it."""
    from agent.core.errors import OvernightError
    from agent.engine.scheduler import SchedulerSettings
    from agent.ops.confirm import night_device, prepare_confirm
    from overnight.cli_foreground import drive_locked
    from overnight.cli_results import find_sweep
    from overnight.runtime import open_target

    rt = runtime_for(db, work_dir)
    found = find_sweep(rt.store, name, None, db_location(db))
    n_slots, on = slots_and_devices(slots, devices)
    rt.hold_lock(hint=" (confirm runs its runs itself; stop that process first)")
    try:
        rt.recover()
        repo = open_target(Path(found.target_path))
        conf = prepare_confirm(rt.store, repo, found, at, seeds)
        console.print(f"confirmation sweep [bold]{conf.name}[/bold]: the baseline and the best "
                      f"at {at.text()}, {seeds} seeds each ({2 * seeds} runs)")
        device = at.device or night_device(rt.store, found)  # else where the night ran
        settings = SchedulerSettings(slots=n_slots, devices=on, device=device)
        drive_locked(rt, conf, settings)
    except OvernightError as exc:
        fail(str(exc))
    finally:
        rt.release_lock()
    print_confirmation(rt.store, found.name)


def print_confirmation(store: Store, name: str) -> None:
    from agent.analysis.morning_md import confirmation_markdown
    from agent.ops.morning import report_of

    found = report_of(store, name).confirmation
    if found is None:
        console.print("the confirmation did not finish: `overnight report` shows it once it has")
        return
    sys.stdout.write("\n" + confirmation_markdown(found) + "\n")
    console.print(f"the full report: overnight report --sweep {name}")


def has_gain(store: Store, sweep: Sweep) -> bool:
    """Did the night keep a change (something to confirm)?"""
    from agent.core.errors import ConflictError
    from agent.ops.finalize import kept_chain

    try:
        return bool(kept_chain(store, sweep)[1])
    except ConflictError:
        return False


def check_confirm_at(text: str | None, target: Path) -> ConfirmAt | None:
    """`run --confirm-at`, checked before the night starts: the setting parsed and a size
    knob found in the target's committed files (None without one). Exits on bad input."""
    if text is None:
        return None
    from agent.analysis.confirm import parse_at
    from agent.core.config import load_config
    from agent.core.errors import OvernightError
    from agent.ops.confirm import find_knob
    from overnight.runtime import open_target

    try:
        at = parse_at(text)
        if at.knob is not None:
            find_knob(open_target(target), "HEAD", load_config(target), at.knob)
    except OvernightError as exc:
        fail(str(exc))
    return at
