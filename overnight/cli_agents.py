"""`overnight mcp`, `overnight tools`, `overnight agent-instructions`: coding-agent entry points.

Registers its commands on `overnight.cli_common.app` when imported (overnight.cli imports it).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Annotated

import typer

from overnight.cli_common import (
    DbOpt,
    DevicesOpt,
    ExecutorOpt,
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
    app,
    db_location,
    executor_options,
    executor_slots,
    fail,
    runtime_for,
    slurm_options,
    work_dir_of,
)


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
    from overnight.mcp_stdio import serve_stdio

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
