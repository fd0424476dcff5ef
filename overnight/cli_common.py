"""What every command module shares: the typer app, the --db option, the consoles, `fail`,
one Runtime per database per process, and the private umask every command but `init` and
`adopt` runs under."""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from sqlalchemy.exc import OperationalError

from agent.core.private import owner_only
from agent.ops.notify import NotifyConfig, load_notify_config, target_of
from db.location import DbLocation, DbLocationError
from overnight.environment import default_db, environment, notify_config_path
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
# Commands that write the user's own project files, with the user's umask.
YOUR_FILES = frozenset({"init", "adopt"})


@app.callback()
def _private_files(ctx: typer.Context) -> None:
    # What a command (and every run it starts) creates is its user's only: the database, the
    # token, logs, worktrees, commits in a target's .git, reports. Restored when it ends.
    if ctx.invoked_subcommand not in YOUR_FILES:
        stack = contextlib.ExitStack()
        stack.enter_context(owner_only())
        ctx.call_on_close(stack.close)

DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db", help="SQLite file or postgresql://user@host[:port]/dbname (default "
        "$OVERNIGHT_DB or ~/.overnight/overnight.db); a password goes in ~/.pgpass or "
        "$PGPASSWORD, not the URL"
    ),
]
WorkDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--work-dir", help="this machine's folder for worktrees, logs (and, for PostgreSQL, "
        "the service token): default $OVERNIGHT_WORK_DIR, else <db>.work beside a SQLite "
        "file, ~/.overnight/<host>-<dbname>.work for PostgreSQL"
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
    from agent.engine.devices import detect_devices, parse_devices

    found = parse_devices(devices) if devices else detect_devices()
    return (slots if slots is not None else max(len(found), 1)), found


ExecutorOpt = Annotated[str, typer.Option(
    help="where runs execute: local (this machine) | ray (tasks on an existing Ray cluster; "
    "pip install 'overnight\\[ray]') | slurm (one Slurm job per run; the work dir on a "
    "filesystem the nodes share)")]
RayAddressOpt = Annotated[str | None, typer.Option(
    help="with --executor ray: the cluster to join, e.g. 10.0.0.5:6379 (default $RAY_ADDRESS, "
    "else this machine's cluster)")]
RayGpusOpt = Annotated[float, typer.Option(min=0, help="with --executor ray: GPUs per run")]
RayCpusOpt = Annotated[float, typer.Option(min=0, help="with --executor ray: CPUs per run")]
RayResourceOpt = Annotated[list[str] | None, typer.Option(
    help="with --executor ray: a custom Ray resource per run, NAME=AMOUNT (repeatable)")]


SlurmPartitionOpt = Annotated[str | None, typer.Option(
    help="with --executor slurm: the partition (default: the cluster's default partition)")]
SlurmAccountOpt = Annotated[str | None, typer.Option(
    help="with --executor slurm: the account the jobs are charged to")]
SlurmQosOpt = Annotated[str | None, typer.Option(help="with --executor slurm: the QOS")]
SlurmGpusOpt = Annotated[int, typer.Option(
    min=0, help="with --executor slurm: GPUs per run, asked as --gres=gpu:N (0: none)")]
SlurmGresOpt = Annotated[str | None, typer.Option(
    help="with --executor slurm: the site's own --gres per run instead, e.g. gpu:a100:1")]
SlurmOptionOpt = Annotated[list[str] | None, typer.Option(
    help="with --executor slurm: one more #SBATCH line per job, given as "
    "--slurm-option=--mem=64G (repeatable)")]


def slurm_options(partition: str | None, account: str | None, qos: str | None, gpus: int,
                  gres: str | None, option: list[str] | None) -> dict[str, Any]:
    """The --slurm-* options as SchedulerSettings fields; an extra line that is not one sbatch
    option is refused."""
    from agent.core.errors import ConfigError
    from agent.executors.slurm import sbatch_line

    try:
        lines = tuple(sbatch_line(line) for line in option or ())
    except ConfigError as exc:
        fail(str(exc))
    return {"slurm_partition": partition, "slurm_account": account, "slurm_qos": qos,
            "slurm_gpus": gpus, "slurm_gres": gres, "slurm_options": lines}


def executor_options(executor: str, ray_address: str | None, ray_gpus: float, ray_cpus: float,
                     ray_resource: list[str] | None,
                     slurm: dict[str, Any] | None = None) -> dict[str, Any]:
    """--executor, the --ray-* and the --slurm-* options, checked, as SchedulerSettings
    fields."""
    if executor not in ("local", "ray", "slurm"):
        fail(f"--executor: expected 'local', 'ray' or 'slurm', got {executor!r}")
    resources: dict[str, float] = {}
    for item in ray_resource or ():
        name, _, amount = item.partition("=")
        try:
            resources[name.strip()] = float(amount)
        except ValueError:
            fail(f"--ray-resource: expected NAME=AMOUNT such as 'A100=1', got {item!r}")
    if executor != "ray" and (ray_address or resources):
        fail("--ray-address/--ray-resource need --executor ray")
    slurm = slurm or {}
    chosen = [k for k, v in slurm.items() if v and not (k == "slurm_gpus" and v == 1)]
    if executor != "slurm" and chosen:
        fail(f"--{chosen[0].replace('_', '-')}: the --slurm-* options need --executor slurm")
    return {"executor": executor, "ray_address": ray_address, "ray_gpus": ray_gpus,
            "ray_cpus": ray_cpus, "ray_resources": resources, **slurm}


def executor_slots(slots: int | None, devices: str | None,
                   options: dict[str, Any]) -> tuple[int, tuple[str, ...]]:
    """Slots and devices: as slots_and_devices locally; on Ray, one slot per run the cluster
    can hold at once (its GPUs / --ray-gpus) unless --slots says otherwise; on Slurm, --slots
    jobs in flight (default 1)."""
    if options["executor"] == "slurm":
        if devices:
            fail("--devices is for the local executor: Slurm gives each job its GPUs "
                 "(--slurm-gpus, --slurm-gres)")
        from agent.core.errors import ConfigError
        from agent.executors.slurm_cli import partition_nodes

        try:  # the cluster answers and has the partition (its nodes' view: at the start)
            partition_nodes(options["slurm_partition"])
        except ConfigError as exc:
            fail(str(exc))
        return (slots if slots is not None else 1), ()
    if options["executor"] != "ray":
        return slots_and_devices(slots, devices)
    if devices:
        fail("--devices is for the local executor: Ray gives each run a GPU of the cluster")
    if slots is not None:
        return slots, ()
    from agent.core.errors import ConfigError
    from agent.executors.ray import cluster_slots

    try:
        return cluster_slots(options["ray_address"], options["ray_gpus"],
                             options["ray_cpus"]), ()
    except ConfigError as exc:
        fail(str(exc))


def db_location(db: str | DbLocation | None) -> DbLocation:
    """--db as given, else $OVERNIGHT_DB, else ~/.overnight/overnight.db; a value that names
    no database is a clear error."""
    try:
        return DbLocation.parse(db) if db is not None else default_db()
    except DbLocationError as exc:
        fail(f"{'--db' if db is not None else '$OVERNIGHT_DB'}: {exc}")


def work_dir_of(where: DbLocation, given: Path | None) -> Path:
    """--work-dir, else $OVERNIGHT_WORK_DIR, else the database's default (db.location)."""
    chosen = given or environment().work_dir
    return chosen.expanduser().resolve() if chosen else where.default_work_dir()


def runtime_for(db: str | DbLocation | None, work_dir: Path | None = None) -> Runtime:
    """The Runtime of this database (one per process: migrations are checked once)."""
    where = db_location(db)
    try:
        return _runtime(where, work_dir_of(where, work_dir))
    except OperationalError as exc:  # a server that is down, a database that does not exist
        fail(f"cannot open {where}: {getattr(exc, 'orig', exc)}".strip())


@functools.cache
def _runtime(where: DbLocation, work_dir: Path) -> Runtime:
    return Runtime(where, work_dir=work_dir)


def own_command() -> str:
    """`overnight` when it is on PATH, else the path of this one (e.g. .venv/bin/overnight)."""
    here = Path(sys.executable).parent / "overnight"
    on_path = shutil.which("overnight")
    if on_path and Path(on_path).resolve() == here.resolve():
        return "overnight"
    return str(here) if here.exists() else "overnight"


def token_command(where: DbLocation, work_dir: Path | None = None) -> str:
    """The command that prints this database's token (`overnight token`, with --db unless it
    is the default one, and --work-dir when one was given)."""
    args = [own_command(), "token"]
    if where != default_db():
        args += ["--db", str(where)]
    if work_dir is not None:
        args += ["--work-dir", str(work_dir)]
    return shlex.join(args)


def fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(2)


# --- --notify and --notify-config (overnight run and serve) --------------------------------
NotifyOpt = Annotated[list[str] | None, typer.Option(
    "--notify", help="POST an event to this URL on a keep, a crash streak, a plateau, a pause "
    "and the end of the night (repeatable; slack+URL / ntfy+URL name the body, else it is read "
    "off the host)")]
NotifyConfigOpt = Annotated[Path | None, typer.Option(
    help="notify file with \\[\\[notify]] tables (default $OVERNIGHT_NOTIFY_CONFIG, else "
    "~/.overnight/notify.toml when it exists)")]


def notify_targets(urls: list[str] | None, path: Path | None) -> NotifyConfig:
    """The notify file's targets (if any) and the --notify URLs; ConfigError on bad input."""
    file, named = notify_config_path(path)
    found = load_notify_config(file) if named or file.is_file() else NotifyConfig([])
    targets = [*found.targets, *(target_of(u) for u in urls or ())]
    return NotifyConfig(targets, found.crash_streak)


def announce(config: NotifyConfig, console: Console) -> None:
    """Say where notifications go (each URL redacted: its secret is never printed)."""
    if config.targets:
        console.print("notifications to " + ", ".join(str(t) for t in config.targets),
                      soft_wrap=True, markup=False)
