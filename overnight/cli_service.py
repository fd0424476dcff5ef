"""The long-running and agent-facing entry points: `overnight serve` (the REST API, the dashboard
and the experiment scheduler: uvicorn + APScheduler in one process), `overnight token`, and for
coding agents `overnight mcp` (the agent tools over MCP stdio on a Runtime, optionally executing
the queue), `overnight tools` and `overnight agent-instructions`.

Registers its commands on `overnight.cli_common.app` when imported (overnight.cli imports it).
"""

from __future__ import annotations

import json
import logging
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from db.location import DbLocation
from overnight import cli_track
from overnight.cli_common import (
    DbOpt,
    DevicesOpt,
    ExecutorOpt,
    NotifyConfigOpt,
    NotifyOpt,
    RayAddressOpt,
    RayCpusOpt,
    RayGpusOpt,
    RayResourceOpt,
    SlotsOpt,
    SlurmAccountOpt,
    SlurmGpusOpt,
    SlurmGresOpt,
    SlurmOptionOpt,
    SlurmPartitionOpt,
    SlurmQosOpt,
    WorkDirOpt,
    announce,
    app,
    console,
    db_location,
    err,
    executor_options,
    executor_slots,
    fail,
    notify_targets,
    runtime_for,
    slurm_options,
    token_command,
    work_dir_of,
)
from overnight.environment import environment
from overnight.runtime import Runtime

if TYPE_CHECKING:
    from agent.engine.recovery import DatabaseLock
    from agent.engine.scheduler import SchedulerSettings

logger = logging.getLogger(__name__)


# --- serve and token: the service -------------------------------------------------------------
@app.command()
def serve(
    db: DbOpt = None,
    host: Annotated[str, typer.Option(help="address to bind (non-loopback refuses --no-auth)")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port (0: any free port)")] = 8000,
    slots: SlotsOpt = None,
    devices: DevicesOpt = None,
    executor: ExecutorOpt = "local",
    ray_address: RayAddressOpt = None,
    ray_gpus: RayGpusOpt = 1.0,
    ray_cpus: RayCpusOpt = 1.0,
    ray_resource: RayResourceOpt = None,
    slurm_partition: SlurmPartitionOpt = None,
    slurm_account: SlurmAccountOpt = None,
    slurm_qos: SlurmQosOpt = None,
    slurm_gpus: SlurmGpusOpt = 1,
    slurm_gres: SlurmGresOpt = None,
    slurm_option: SlurmOptionOpt = None,
    token_file: Annotated[Path | None, typer.Option(
        help="file holding the bearer token (default: $OVERNIGHT_TOKEN, else the file beside "
        "the SQLite database or in the work dir for PostgreSQL, created on first start)")]
    = None,
    token: Annotated[str | None, typer.Option(hidden=True, help="refused: shows in ps")] = None,
    allowed_host: Annotated[list[str] | None, typer.Option(
        help="also answer to this Host name (repeatable or comma-separated; '*': any; default "
        "$OVERNIGHT_ALLOWED_HOSTS). Loopback names and --host are always accepted")] = None,
    heartbeat: Annotated[float, typer.Option(hidden=True, help="seconds between SSE "
                                             "heartbeats on a silent log stream")] = 15.0,
    no_auth: Annotated[bool, typer.Option("--no-auth", help="no token at all (loopback only): "
                                          "every user of this machine can read and write")]
    = False,
    open_reads: Annotated[bool, typer.Option(
        "--open-reads", help="reads without the token: everyone who can connect (every user "
        "of this machine on loopback) reads every sweep, diff and log; writes still need it")]
    = False,
    poll: Annotated[float, typer.Option(help="seconds between idle slot checks")] = 1.0,
    log_level: Annotated[str, typer.Option(help="uvicorn/app log level")] = "info",
    retention: Annotated[str | None, typer.Option(
        help="every 6 h, prune experiments finished longer ago than this (e.g. 7d) as "
        "`overnight gc --older-than` does (logs of kept ones stay)")] = None,
    work_dir: WorkDirOpt = None,
    notify: NotifyOpt = None,
    notify_config: NotifyConfigOpt = None,
    track: cli_track.TrackOpt = None,
    no_engine: Annotated[bool, typer.Option("--no-engine", help="the API and dashboard only: "
                                            "no slots, no scheduled starts, no instance lock; "
                                            "the service that runs the engine executes what "
                                            "this one queues (more services on one "
                                            "PostgreSQL database)")] = False,
) -> None:
    """Run the REST API and the experiment scheduler (one process, one worker)."""
    import uvicorn

    from api.settings import TOKEN_ENV, RedactToken, Settings
    from overnight.runtime import service_app

    where = db_location(db)
    work = work_dir_of(where, work_dir)
    notifying = notify_targets(notify, notify_config)
    if notifying.targets and no_engine:
        fail("--notify needs the engine: the service that runs the engine sends them")
    announce(notifying, console)
    tracking = cli_track.track_choice(track)
    if track is not None and no_engine:
        fail("--track needs the engine: the service that runs the engine mirrors the night")
    mirrored_to = cli_track.ready(tracking, None)
    if mirrored_to is not None:
        console.print(f"mirroring every sweep to {mirrored_to}", soft_wrap=True, markup=False)
    if token is not None:
        fail("--token VALUE would show the token to every user of this machine (ps, shell "
             f"history); put it in a file (mode 0600) and give --token-file PATH, or set "
             f"{TOKEN_ENV}")
    secret, shown_by = (None, "") if no_auth else _token(where, work, work_dir, token_file)
    runs_on = executor_options(executor, ray_address, ray_gpus, ray_cpus, ray_resource,
                               slurm_options(slurm_partition, slurm_account, slurm_qos,
                                             slurm_gpus, slurm_gres, slurm_option))
    slots, found = (0, ()) if no_engine else executor_slots(slots, devices, runs_on)
    settings = Settings.build(db_path=where, work_dir=work, host=host, port=port, slots=slots,
                              devices=found, token=secret, auth=not no_auth,
                              read_auth=not open_reads, poll_interval_s=poll,
                              allowed_hosts=_allowed_hosts(allowed_host),
                              sse_heartbeat_s=heartbeat, run_scheduler=not no_engine,
                              retention=retention, **runs_on)
    lock = None if no_engine else _instance_lock(where)
    logging.getLogger().setLevel(log_level.upper())
    if logging.getLogger().level > logging.DEBUG:  # its two lines per second are debug noise
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
    try:
        sock = _bind(host, port)
    except OSError as exc:
        if lock is not None:
            lock.release()
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        return
    bound = sock.getsockname()[1]
    url_host = f"[{host}]" if ":" in host else host
    on = {"ray": f" on the Ray cluster {ray_address or 'of this machine'}",
          "slurm": f" as Slurm jobs (partition {slurm_partition or 'default'})"}.get(executor, "")
    engine = "no engine" if no_engine else f"{slots} slot(s){on}"
    console.print(f"overnight serve: db {where}, {engine}, auth "
                  f"{'off' if no_auth else 'on'}, listening on http://{url_host}:{bound}/",
                  soft_wrap=True)
    warning = settings.open_access_warning(bound)
    if warning is not None:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}", soft_wrap=True)
    sign_in = (f" (sign in with the token: {shown_by})" if settings.reads_need_token
               else " (open: no sign-in)")
    console.print(f"dashboard: http://{url_host}:{bound}/{escape(sign_in)}", soft_wrap=True)
    sys.stdout.flush()
    link = f"http://{socket.gethostname() if host in ('0.0.0.0', '::') else url_host}:{bound}"
    app = service_app(settings, lock=lock, notify=notifying, track=tracking, dashboard_url=link)
    config = uvicorn.Config(app, host=host,
                            port=bound, workers=1,
                            log_level=log_level, timeout_graceful_shutdown=int(settings.grace_s)
                            + 15)
    for name in ("uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).addFilter(RedactToken(settings.token))
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        if lock is not None:
            lock.release()


def _instance_lock(where: DbLocation) -> DatabaseLock:
    """The database's instance lock, or a clear error naming who holds it."""
    from agent.engine.recovery import InstanceLockError
    from db.lock import instance_lock

    try:
        return instance_lock(where)
    except InstanceLockError as exc:
        fail(str(exc))


def _allowed_hosts(given: list[str] | None) -> tuple[str, ...]:
    """--allowed-host values (comma-separated too), else $OVERNIGHT_ALLOWED_HOSTS."""
    if not given:
        return environment().allowed_hosts
    return tuple(h.strip() for v in given for h in v.split(",") if h.strip())


def _token(db: DbLocation, work_dir: Path, given_work_dir: Path | None,
           token_file: Path | None) -> tuple[str, str]:
    """--token-file, else $OVERNIGHT_TOKEN, else the file beside the database (made once);
    and how its user reads it (a command or a file, never the token itself)."""
    from api.settings import TOKEN_ENV, ensure_token

    if token_file is not None:
        try:
            value = token_file.expanduser().read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"--token-file {token_file}: cannot read it: {exc}")
        if not value:
            fail(f"--token-file {token_file} is empty")
        console.print(f"token read from {token_file}", soft_wrap=True)
        return value, f"the file {token_file}"
    from_env = environment().token
    if from_env is not None:
        console.print(f"token from ${TOKEN_ENV}")
        return from_env.get_secret_value(), f"${TOKEN_ENV}"
    value, path, created = ensure_token(db, work_dir)
    shown_by = f"{token_command(db, given_work_dir)} prints it, or read {path}"
    console.print(f"token {'created in' if created else 'read from'} {path}: "
                  f"{token_command(db, given_work_dir)} prints it (send it as "
                  "'Authorization: Bearer <token>', or paste it into the dashboard's login form)",
                  soft_wrap=True, markup=False)
    return value, shown_by


@app.command("token")
def token_cmd(db: DbOpt = None, work_dir: WorkDirOpt = None) -> None:
    """Print the token `overnight serve` uses for this database (created on first use): for
    the dashboard's login form or 'Authorization: Bearer <token>'."""
    from api.settings import TOKEN_ENV, ensure_token

    where = db_location(db)
    from_env = environment().token
    if from_env is not None:
        err.print(f"from ${TOKEN_ENV} (which `overnight serve` uses before the file)")
        sys.stdout.write(from_env.get_secret_value() + "\n")
        return
    try:
        value, path, created = ensure_token(where, work_dir_of(where, work_dir))
    except OSError as exc:
        fail(f"cannot read or create the token of {where}: {exc}")
    if created:
        err.print(f"created {path} (mode 0600); `overnight serve` on {where} uses it",
                  markup=False)
    sys.stdout.write(value + "\n")


def _bind(host: str, port: int) -> socket.socket:
    """Bind before uvicorn starts so `--port 0` can be reported and a busy port fails early."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY on accepted connections only when the
    # listening socket's proto is IPPROTO_TCP (proto 0 left Nagle on: every keep-alive
    # request then waited ~40 ms for a delayed ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


# --- mcp, tools, agent-instructions: the coding agents' entry points --------------------------
@app.command("mcp")
def mcp_command(
    db: DbOpt = None,
    run: Annotated[bool, typer.Option("--run", help="also execute queued experiments in this "
                                      "process (when no `overnight serve` uses the database)")]
    = False,
    slots: SlotsOpt = None,
    devices: DevicesOpt = None,
    executor: ExecutorOpt = "local",
    ray_address: RayAddressOpt = None,
    ray_gpus: RayGpusOpt = 1.0,
    ray_cpus: RayCpusOpt = 1.0,
    ray_resource: RayResourceOpt = None,
    slurm_partition: SlurmPartitionOpt = None,
    slurm_account: SlurmAccountOpt = None,
    slurm_qos: SlurmQosOpt = None,
    slurm_gpus: SlurmGpusOpt = 1,
    slurm_gres: SlurmGresOpt = None,
    slurm_option: SlurmOptionOpt = None,
    work_dir: WorkDirOpt = None,
) -> None:
    """Serve the agent tools over MCP stdio (for Claude Code, Codex and other MCP clients).

    With --run, the slot options are those of `overnight run` and `serve`: one slot per GPU by
    default, or runs as tasks on a Ray cluster with --executor ray."""
    from agent.engine.scheduler import SchedulerSettings

    runs_on = executor_options(executor, ray_address, ray_gpus, ray_cpus, ray_resource,
                               slurm_options(slurm_partition, slurm_account, slurm_qos,
                                             slurm_gpus, slurm_gres, slurm_option))
    given = [name for name, chosen in (("--slots", slots is not None),
                                       ("--devices", devices is not None),
                                       ("--executor", executor != "local")) if chosen]
    if given and not run:
        fail(f"{', '.join(given)}: only with --run (without it, the service that uses the "
             "database executes the queue)")
    settings = None
    if run:
        n, found = executor_slots(slots, devices, runs_on)
        settings = SchedulerSettings(slots=n, devices=found, poll_interval_s=0.5, **runs_on)
    # stdout is the protocol channel: everything else goes to stderr.
    logging.getLogger().setLevel(logging.WARNING)
    where = db_location(db)
    serve_stdio(where, settings, work_dir=work_dir_of(where, work_dir))


@app.command("tools")
def tools_command(
    format: Annotated[str, typer.Option("--format", help="openai | anthropic")] = "openai",
) -> None:
    """Print the agent tools as JSON function-calling schemas."""
    from api.mcp.server import tool_schemas

    if format not in ("openai", "anthropic"):
        fail(f"--format must be openai or anthropic, got {format!r}")
    sys.stdout.write(json.dumps(tool_schemas(format), indent=2) + "\n")


@app.command("agent-instructions")
def agent_instructions_command(
    sweep: Annotated[str, typer.Option(help="sweep name")],
    db: DbOpt = None,
) -> None:
    """Print a program.md-style brief telling a coding agent how to run the loop via the tools."""
    from api.mcp.tools import AgentTools, agent_instructions

    sys.stdout.write(agent_instructions(AgentTools(runtime_for(db).service), sweep))


RUN_HINT = " (or drop --run and let that service execute)"


def serve_stdio(db: DbLocation, engine: SchedulerSettings | None = None,
                work_dir: Path | None = None) -> None:
    """The tools over stdio on the database `db` (worktrees and logs in `work_dir`).

    With `engine` settings, this process also executes queued experiments (the service's slot
    scheduler, restart recovery and single-instance lock, without HTTP), for when no
    `overnight serve` uses the database.
    """
    from api.mcp.server import build_server
    from api.mcp.tools import AgentTools

    runtime = Runtime(db, work_dir=work_dir)
    try:
        if engine is not None:
            runtime.start_engine(engine, hint=RUN_HINT)
        build_server(AgentTools(runtime.service), log_level="WARNING").run("stdio")
    finally:
        runtime.close(timeout_s=15)
