"""What every command module shares: the typer app, the --db option, the consoles, `fail`,
and one Runtime per database per process."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from db.paths import default_db
from overnight.runtime import Runtime

app = typer.Typer(
    help="overnight: autonomous ML research loops while you sleep.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err = Console(stderr=True, soft_wrap=True)  # error lines stay whole for grep

DbOpt = Annotated[
    Path | None,
    typer.Option(
        "--db", help="SQLite database (default $OVERNIGHT_DB or ~/.overnight/overnight.db)"
    ),
]


def db_path(db: Path | None) -> Path:
    return (db or default_db()).expanduser()


def runtime_for(db: Path | None) -> Runtime:
    """The Runtime of this database (one per process: migrations are checked once)."""
    return _runtime(db_path(db).resolve())


@functools.cache
def _runtime(path: Path) -> Runtime:
    return Runtime(path)


def fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/red] {message}")
    raise typer.Exit(2)
