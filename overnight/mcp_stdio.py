"""`overnight mcp`: the agent tools over MCP stdio on a Runtime, optionally executing the queue."""

from __future__ import annotations

from pathlib import Path

from agent.devices import detect_devices
from agent.mcp_server import build_server
from agent.mcp_tools import AgentTools
from agent.scheduler import SchedulerSettings
from overnight.runtime import Runtime

RUN_HINT = " (or drop --run and let that service execute)"


def serve_stdio(db_path: Path, *, run: bool = False, slots: int = 1) -> None:
    """The tools over stdio on the database at `db_path`.

    With `run`, this process also executes queued experiments (the service's slot scheduler,
    restart recovery and single-instance lock, without HTTP), for when no `overnight serve`
    uses the database.
    """
    runtime = Runtime(db_path)
    try:
        if run:
            settings = SchedulerSettings(slots=slots, devices=detect_devices(),
                                         poll_interval_s=0.5)
            runtime.start_engine(settings, hint=RUN_HINT)
        build_server(AgentTools(runtime.service), log_level="WARNING").run("stdio")
    finally:
        runtime.close(timeout_s=15)
