"""`overnight mcp`: the agent tools over MCP stdio on a Runtime, optionally executing the queue."""

from __future__ import annotations

from pathlib import Path

from agent.engine.scheduler import SchedulerSettings
from api.mcp.server import build_server
from api.mcp.tools import AgentTools
from db.location import DbLocation
from overnight.runtime import Runtime

RUN_HINT = " (or drop --run and let that service execute)"


def serve_stdio(db: DbLocation, engine: SchedulerSettings | None = None,
                work_dir: Path | None = None) -> None:
    """The tools over stdio on the database `db` (worktrees and logs in `work_dir`).

    With `engine` settings, this process also executes queued experiments (the service's slot
    scheduler, restart recovery and single-instance lock, without HTTP), for when no
    `overnight serve` uses the database.
    """
    runtime = Runtime(db, work_dir=work_dir)
    try:
        if engine is not None:
            runtime.start_engine(engine, hint=RUN_HINT)
        build_server(AgentTools(runtime.service), log_level="WARNING").run("stdio")
    finally:
        runtime.close(timeout_s=15)
