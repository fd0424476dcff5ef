"""The MCP server (official `mcp` SDK 1.x, FastMCP) exposing agent.mcp_tools to coding agents.

`build_server(tools)` registers every tool as an async function that runs the blocking
store/git work in a worker thread, so a long `wait_for_experiment` never stalls the event
loop (it polls the database with async sleeps). `overnight mcp` serves it over stdio; the
HTTP service mounts the same server under /mcp (api.mcp_http).
"""

from __future__ import annotations

import inspect
import logging
import time
import typing
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.types import ToolAnnotations

from agent.errors import OvernightError
from agent.mcp_tools import DESCRIPTIONS, POLL_S, AgentTools, ExperimentResult

logger = logging.getLogger(__name__)
SERVER_NAME = "overnight"
INSTRUCTIONS = (
    "overnight runs ML training experiments one change at a time under a fixed time budget, "
    "keeping a change only if the metric improves. Loop: get_target and get_best, then "
    "propose_experiment (one idea, a unified diff against the best files), "
    "wait_for_experiment, read the result (get_log on a crash), repeat until the sweep's limits."
)
READ_ONLY = {"get_target", "get_best", "list_experiments", "get_results_table", "get_log",
             "wait_for_experiment"}


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


def serve_stdio(db_path: str, *, run: bool = False, slots: int = 1) -> None:
    """`overnight mcp`: the tools over stdio on the database at `db_path`.

    With `run`, this process also executes queued experiments (the service's slot scheduler,
    restart recovery and single-instance lock, without HTTP), for when no `overnight serve`
    uses the database.
    """
    from db.engine import open_database
    from db.store import SqlStore

    store = SqlStore(open_database(db_path))
    repos: dict[str, Any] = {}

    def repo_for(sweep: Any) -> Any:
        from agent.gitrepo import GitRepo

        if sweep.target_path not in repos:
            repos[sweep.target_path] = GitRepo(sweep.target_path)
        return repos[sweep.target_path]

    if not run:
        build_server(AgentTools(store, repo_for), log_level="WARNING").run("stdio")
    else:
        _serve_and_execute(store, repo_for, Path(db_path), slots)


def _serve_and_execute(store: Any, repo_for: Callable[[Any], Any], db_path: Path,
                       slots: int) -> None:
    from agent.errors import ConfigError
    from agent.recovery import InstanceLock, InstanceLockError, recover
    from agent.scheduler import SchedulerSettings, SlotScheduler, default_loop_factory, gpu_count
    from agent.wiring import work_dir_for

    try:
        lock = InstanceLock(db_path).acquire()
    except InstanceLockError as exc:
        raise ConfigError(f"{exc} (or drop --run and let that service execute)") from None
    work = work_dir_for(db_path)
    settings = SchedulerSettings(db_path=db_path, slots=slots, gpu_count=gpu_count(),
                                 poll_interval_s=0.5)
    try:
        recover(store, repo_for, work)
        scheduler = SlotScheduler(store, settings,
                                  default_loop_factory(store, repo_for, work, settings))
        scheduler.start()
        try:
            tools = AgentTools(store, repo_for, stop_running=scheduler.cancel)
            build_server(tools, log_level="WARNING").run("stdio")
        finally:
            scheduler.shutdown(timeout_s=settings.grace_s + 10)
    finally:
        lock.release()


def tool_schemas(fmt: str) -> list[dict[str, Any]]:
    """The same tools as JSON function-calling schemas ('openai' or 'anthropic')."""
    server = build_server(AgentTools(store=None))  # type: ignore[arg-type]
    listed = anyio.run(server.list_tools)
    if fmt == "anthropic":
        return [{"name": t.name, "description": t.description or "",
                 "input_schema": t.inputSchema} for t in listed]
    if fmt == "openai":
        return [{"type": "function", "function": {"name": t.name,
                                                  "description": t.description or "",
                                                  "parameters": t.inputSchema}} for t in listed]
    raise ValueError(f"format must be openai or anthropic, got {fmt!r}")
