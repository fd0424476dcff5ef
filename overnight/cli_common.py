"""What every command module shares: the typer app, the --db option, the consoles, `fail`,
and one Runtime per database per process."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from db.paths import default_db
from overnight.runtime import Runtime

app = typer.Typer(
    help="overnight: autonomous ML research loops while you sleep.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Piped output is read by people too: wide enough that tables do not fold into strips.
console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200)
err = Console(stderr=True, soft_wrap=True)  # error lines stay whole for grep

DbOpt = Annotated[
    Path | None,
    typer.Option(
        "--db", help="SQLite database (default $OVERNIGHT_DB or ~/.overnight/overnight.db)"
    ),
]


SlotsOpt = Annotated[
    int | None,
    typer.Option(min=0, max=64, help="experiments run at once (default: one per GPU, else 1)"),
]
DevicesOpt = Annotated[
    str | None,
    typer.Option(help="GPU indexes for the slots, e.g. 0,1,4 (default: every visible GPU); "
                 "slot i runs on the i-th"),
]


def slots_and_devices(slots: int | None, devices: str | None) -> tuple[int, tuple[str, ...]]:
    """--slots/--devices resolved: given or detected GPUs, and one slot per GPU by default."""
    from agent.devices import detect_devices, parse_devices

    found = parse_devices(devices) if devices else detect_devices()
    return (slots if slots is not None else max(len(found), 1)), found


def db_path(db: Path | None) -> Path:
    return (db or default_db()).expanduser()


def runtime_for(db: Path | None) -> Runtime:
    """The Runtime of this database (one per process: migrations are checked once)."""
    return _runtime(db_path(db).resolve())


@functools.cache
def _runtime(path: Path) -> Runtime:
    return Runtime(path)


def fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(2)
