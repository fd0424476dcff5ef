"""The MCP server (official `mcp` SDK 1.x, FastMCP) exposing api.mcp.tools to coding agents.

`build_server(tools)` registers every tool as an async function that runs the blocking
store/git work in a worker thread, so a long `wait_for_experiment` never stalls the event
loop (it polls the database with async sleeps). `overnight mcp` serves it over stdio
(overnight.cli_service); the HTTP service mounts the same server under /mcp (api.mcp.http).
"""

from __future__ import annotations

import inspect
import logging
import time
import typing
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio
from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.types import ToolAnnotations

from agent.core.errors import OvernightError
from api.mcp.tools import DESCRIPTIONS, POLL_S, AgentTools, ExperimentResult

logger = logging.getLogger(__name__)
SERVER_NAME = "overnight"
INSTRUCTIONS = (
    "overnight runs ML training experiments one change at a time under a fixed time budget, "
    "keeping a change only if the metric improves. Loop: get_target and get_best, get_insights "
    "(what was learned so far), then "
    "propose_experiment (one idea, a unified diff against the best files), "
    "wait_for_experiment, read the result (get_log on a crash), repeat until the sweep's limits."
)
READ_ONLY = {"get_target", "get_best", "list_experiments", "get_results_table", "get_log",
             "wait_for_experiment", "get_insights", "get_report"}


def _async_tool(method: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """An async twin of a blocking tool method, with the same (resolved) signature."""
    hints = typing.get_type_hints(method, include_extras=True)
    sig = inspect.signature(method)
    params = [p.replace(annotation=hints.get(p.name, p.annotation))
              for p in sig.parameters.values()]
    resolved = sig.replace(parameters=params, return_annotation=hints.get("return"))

    async def run(**kwargs: Any) -> Any:
        try:
            return await anyio.to_thread.run_sync(partial(method, **kwargs))
        except OvernightError as exc:
            raise ToolError(str(exc)) from None

    run.__name__ = method.__name__
    run.__doc__ = method.__doc__
    run.__signature__ = resolved  # type: ignore[attr-defined]
    return run


def _wait_tool(tools: AgentTools) -> Callable[..., Awaitable[ExperimentResult]]:
    blocking = _async_tool(tools.wait_for_experiment)

    async def wait_for_experiment(**kwargs: Any) -> ExperimentResult:
        exp_id, timeout_s = kwargs["id"], kwargs.get("timeout_s", 600)
        start = time.monotonic()
        while True:
            try:
                result = await anyio.to_thread.run_sync(
                    tools.experiment_result, exp_id, time.monotonic() - start)
            except OvernightError as exc:
                raise ToolError(str(exc)) from None
            if result.finished or time.monotonic() - start >= timeout_s:
                return result
            await anyio.sleep(POLL_S)

    wait_for_experiment.__signature__ = blocking.__signature__  # type: ignore[attr-defined]
    return wait_for_experiment


def build_server(tools: AgentTools, **settings: Any) -> FastMCP:
    """A FastMCP server with every tool; `settings` go to FastMCP (e.g. stateless_http)."""
    server = FastMCP(SERVER_NAME, instructions=INSTRUCTIONS, **settings)
    for name, description in DESCRIPTIONS.items():
        fn = _wait_tool(tools) if name == "wait_for_experiment" else _async_tool(
            getattr(tools, name))
        server.add_tool(fn, name=name, description=description,
                        annotations=ToolAnnotations(readOnlyHint=name in READ_ONLY,
                                                    destructiveHint=False))
    return server


def tool_schemas(fmt: str) -> list[dict[str, Any]]:
    """The same tools as JSON function-calling schemas ('openai' or 'anthropic')."""
    server = build_server(AgentTools(None))  # type: ignore[arg-type]  # listing only
    listed = anyio.run(server.list_tools)
    if fmt == "anthropic":
        return [{"name": t.name, "description": t.description or "",
                 "input_schema": t.inputSchema} for t in listed]
    if fmt == "openai":
        return [{"type": "function", "function": {"name": t.name,
                                                  "description": t.description or "",
                                                  "parameters": t.inputSchema}} for t in listed]
    raise ValueError(f"format must be openai or anthropic, got {fmt!r}")
