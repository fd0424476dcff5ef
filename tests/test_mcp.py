"""MCP end to end: `overnight mcp` over stdio with the SDK's real client, and the HTTP mount.

Queued experiments are executed by a Loop thread in the test over the same SQLite database
(what `overnight serve` does in production), so propose → wait → read is real.
"""

from __future__ import annotations

import difflib
import json
import shutil
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from agent.core.domain import utcnow
from agent.engine.loop import Loop, LoopSettings
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo, init_repo
from agent.ops.sweeps import create_sweep
from db.engine import open_database
from db.store import SqlStore

FIXTURE = Path(__file__).parent / "fixtures" / "fake_target"
OVERNIGHT = Path(sys.executable).parent / "overnight"
TOKEN = "test-token-0123456789abcdef"


class Executor:
    """Runs a sweep's queue in a thread, like the service's slot would; can be paused."""

    def __init__(self, db: Path, target: Path, sweep: str, work: Path) -> None:
        self.store = SqlStore(open_database(db))
        self.loop = Loop(self.store, GitRepo(target), SubprocessRunner(grace_s=1),
                         LoopSettings(work))
        self.sweep = sweep
        self.stop, self.paused = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            sweep = self.store.get_sweep(self.sweep)
            exp = None if self.paused.is_set() else self.store.claim_next(sweep.id)
            if exp is None:
                time.sleep(0.05)
                continue
            self.loop.execute(sweep, exp)

    def __enter__(self) -> Executor:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    return night_target(tmp_path)


def night_target(tmp_path: Path) -> tuple[Path, Path]:
    """(database, target): the fake target with a program.md and a queue sweep `night`."""
    target = tmp_path / "target"
    shutil.copytree(FIXTURE, target, ignore=shutil.ignore_patterns("__pycache__"))
    (target / "program.md").write_text("Find the best LR and WIDTH. Do not touch prepare.py.\n")
    init_repo(target)
    db = tmp_path / "db.sqlite"
    store = SqlStore(open_database(db))
    create_sweep(store, GitRepo(target), target, name="night", proposer="queue",
                 max_experiments=6)
    return db, target


def edit(files: dict[str, str], old: str, new: str, path: str = "train.py") -> str:
    before = files[path]
    assert old in before, f"{old!r} not in {path}"  # never build an empty diff by accident
    after = before.replace(old, new, 1)
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                        f"a/{path}", f"b/{path}"))


class Transcript:
    """Calls tools through a ClientSession and keeps a short, readable record."""

    def __init__(self, session: ClientSession) -> None:
        self.session, self.lines = session, []

    async def call(self, name: str, **args: Any) -> tuple[bool, Any]:
        result = await self.session.call_tool(name, args)
        text = result.content[0].text if result.content else ""
        data = result.structuredContent if not result.isError else text
        if isinstance(data, dict) and set(data) == {"result"}:
            data = data["result"]
        shown = {k: (v if len(str(v)) < 60 else str(v)[:57] + "...") for k, v in args.items()}
        answer = json.dumps(data, default=str) if not isinstance(data, str) else data
        answer = answer.replace("\n", " | ")
        self.lines.append(f"> {name}({', '.join(f'{k}={v!r}' for k, v in shown.items())})")
        self.lines.append(("< ERROR " if result.isError else "< ") + (
            answer if len(answer) < 300 else answer[:297] + "..."))
        return result.isError, data


async def agent_session(db: Path) -> tuple[list[str], dict[str, Any]]:
    params = StdioServerParameters(command=str(OVERNIGHT), args=["mcp", "--db", str(db)])
    seen: dict[str, Any] = {}
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        seen["server"] = init.serverInfo.name
        seen["tools"] = [t.name for t in (await session.list_tools()).tools]
        t = Transcript(session)
        t.lines.append(f"> list_tools() < {', '.join(seen['tools'])}")
        _, seen["target"] = await t.call("get_target", sweep="night")
        _, seen["baseline"] = await t.call("wait_for_experiment", id=1, timeout_s=30)
        _, best = await t.call("get_best", sweep="night")
        lr = edit(best["files"], "LR = 0.01", "LR = 0.04")
        _, proposed = await t.call("propose_experiment", sweep="night",
                                   description="LR 0.01 -> 0.04", diff=lr)
        _, seen["lr"] = await t.call("wait_for_experiment", id=proposed["id"], timeout_s=30)
        seen["dup"] = await t.call("propose_experiment", sweep="night", description="again",
                                   diff=lr)
        harness = edit({"prepare.py": (FIXTURE / "prepare.py").read_text()}, "1.0\n", "0.0\n",
                       "prepare.py")
        seen["protected"] = await t.call("propose_experiment", sweep="night",
                                         description="cheat", diff=harness)
        _, best = await t.call("get_best", sweep="night")
        typo = edit(best["files"], "USE_TRICK = False", "USE_TRICK = Tru")
        _, proposed = await t.call("propose_experiment", sweep="night",
                                   description="trick on", diff=typo)
        _, seen["typo"] = await t.call("wait_for_experiment", id=proposed["id"], timeout_s=30)
        _, seen["log"] = await t.call("get_log", id=proposed["id"], tail=3)
        _, seen["kept"] = await t.call("list_experiments", sweep="night", status="kept")
        hour_ago, soon = (utcnow() + timedelta(hours=h) for h in (-1, 1))
        _, seen["recent"] = await t.call("list_experiments", sweep="night",
                                         since=hour_ago.isoformat(), until=soon.isoformat())
        _, seen["later"] = await t.call("list_experiments", sweep="night",
                                        since=soon.strftime("%Y-%m-%dT%H:%M"))
        seen["bad_since"] = await t.call("list_experiments", sweep="night", since="tonight")
        _, seen["table"] = await t.call("get_results_table", sweep="night")
        _, seen["insights"] = await t.call("get_insights", sweep="night")
        _, seen["report"] = await t.call("get_report", sweep="night")
        seen["transcript"] = t
    return t.lines, seen


def test_mcp_stdio_session_end_to_end(setup, tmp_path):
    db, target = setup
    with Executor(db, target, "night", tmp_path / "work"):
        lines, seen = anyio.run(agent_session, db)
    print("\n--- MCP stdio session transcript ---\n" + "\n".join(lines))
    assert seen["server"] == "overnight"
    assert set(seen["tools"]) == {"get_target", "get_best", "propose_experiment",
                                  "wait_for_experiment", "list_experiments",
                                  "get_results_table", "get_log", "cancel_experiment",
                                  "get_insights", "get_report"}
    assert seen["target"]["editable"] == ["train.py"] and "best LR" in seen["target"]["program"]
    assert seen["baseline"]["status"] == "kept" and seen["baseline"]["metric"] == pytest.approx(1.3)
    lr = seen["lr"]
    assert lr["status"] == "kept" and lr["delta"] == pytest.approx(-0.2) and lr["improved"]
    assert seen["dup"][0] and "duplicate" in seen["dup"][1]
    assert seen["protected"][0] and "prepare.py is protected" in seen["protected"][1]
    typo = seen["typo"]
    assert typo["status"] == "crashed" and typo["crash_kind"] == "trivial"
    assert "NameError" in typo["log_tail"] and "NameError" in seen["log"]["text"]
    assert [r["description"] for r in seen["kept"]["data"]] == ["LR 0.01 -> 0.04", "baseline"]
    assert [r["id"] for r in seen["recent"]["data"]] == [3, 2, 1]  # created in the last hour
    assert seen["later"]["data"] == [] and seen["later"]["count"] == 0
    assert seen["bad_since"][0] and "since: 'tonight' is not an ISO 8601" in seen["bad_since"][1]
    assert "LR 0.01 -> 0.04" in seen["table"] and seen["table"].startswith("# sweep night")
    insights = seen["insights"]
    print("\n--- get_insights as the agent sees it ---\n" + insights["text"])
    assert "val_bpb (lower is better): baseline 1.300000, best 1.100000" in insights["text"]
    assert "- LR [hyperparameter] now 0.04; 1 runs; tried 0.04; gain by direction: up +0.2" \
        in insights["text"]
    assert [k["name"] for k in insights["data"]["knobs"]] == ["LR"]
    assert insights["data"]["crash_lessons"] == []  # a typo is a bug to fix, not a region
    # the fake target ignores its seed: one run each, and the table says what that means
    assert "1 change(s) kept on one run each: the noise was not measured" in seen["table"]
    assert "# σ̂ not measured" in seen["table"] and "\tp_better\t" in seen["table"]
    report = seen["report"]  # the morning report, as `overnight report` writes it
    assert report.startswith("# Sweep `night`: the morning report")
    assert "**val_bpb 1.300000 → 1.100000**" in report
    assert "| 2 | LR 0.01 -> 0.04 (" in report and "## Crashes and timeouts" in report
    # Refused proposals wrote nothing: baseline, LR, typo.
    store = SqlStore(open_database(db))
    assert [e.id for e in store.list_experiments(store.get_sweep("night").id)] == [1, 2, 3]


def test_tools_directly_cancel_and_instructions(setup, tmp_path):
    """The same tool layer in-process: cancel a queued experiment, refuse a running one."""
    from agent.core.errors import ConflictError
    from api.mcp.tools import AgentTools, agent_instructions

    db, target = setup
    from overnight.runtime import Runtime

    tools = AgentTools(Runtime(db).service)
    files = tools.get_best("night").files
    queued = tools.propose_experiment("night", "width up", edit(files, "WIDTH = 64",
                                                                "WIDTH = 128"))
    assert queued.queued_ahead == 1  # the baseline
    assert tools.cancel_experiment(queued.id).status == "cancelled"
    store = tools.store
    store.claim(1)  # the baseline, as if a service were running it
    with pytest.raises(ConflictError, match="running in the service"):
        tools.cancel_experiment(1)
    text = agent_instructions(tools, "night")
    assert "propose_experiment(\"night\"" in text and "never stop" in text.lower()
    assert "Do not touch prepare.py" in text


def test_mcp_http_mount_with_token(setup, tmp_path):
    import uvicorn

    from api.settings import Settings
    from overnight.runtime import service_app

    db, target = setup
    app = service_app(Settings(db_path=db, token=TOKEN, slots=0, run_scheduler=False))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}/mcp"

    async def call() -> tuple[list[str], str]:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(headers=headers, timeout=30) as http, \
                streamable_http_client(url, http_client=http) as (read, write, _), \
                ClientSession(read, write) as session:
            await session.initialize()
            names = [t.name for t in (await session.list_tools()).tools]
            result = await session.call_tool("get_results_table", {"sweep": "night"})
            return names, result.content[0].text

    try:
        unauthorized = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        names, table = anyio.run(call)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert unauthorized.status_code == 401
    assert "propose_experiment" in names
    assert table.startswith("# sweep night (running)") and "commit\tval_bpb" in table


def test_cli_tools_and_agent_instructions(setup):
    from typer.testing import CliRunner

    from overnight.cli import app

    db, _ = setup
    runner = CliRunner()
    openai = json.loads(runner.invoke(app, ["tools", "--format", "openai"]).stdout)
    anthropic = json.loads(runner.invoke(app, ["tools", "--format", "anthropic"]).stdout)
    assert [t["function"]["name"] for t in openai] == [t["name"] for t in anthropic]
    propose = next(t for t in anthropic if t["name"] == "propose_experiment")
    assert propose["input_schema"]["required"] == ["sweep", "description", "diff"]
    out = runner.invoke(app, ["agent-instructions", "--sweep", "night", "--db", str(db)])
    assert out.exit_code == 0 and "# Research loop for sweep `night`" in out.stdout
    assert runner.invoke(app, ["tools", "--format", "xml"]).exit_code == 2


def propose_width_over_stdio(args: list[str], timeout_s: float,
                             env: dict[str, str] | None = None,
                             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """`overnight <args>` as an MCP stdio server, driven by the official client: propose
    WIDTH 64 -> 256 on sweep `night`, wait for it; (that experiment, the baseline) as the
    tools return them. `env`: the server's environment (default: the client's default one)."""

    async def session() -> tuple[dict[str, Any], dict[str, Any]]:
        params = StdioServerParameters(command=str(OVERNIGHT), args=args, env=env)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            t = Transcript(s)
            _, best = await t.call("get_best", sweep="night")
            _, proposed = await t.call("propose_experiment", sweep="night",
                                       description="width 256",
                                       diff=edit(best["files"], "WIDTH = 64", "WIDTH = 256"))
            _, done = await t.call("wait_for_experiment", id=proposed["id"],
                                   timeout_s=timeout_s)
            _, base = await t.call("wait_for_experiment", id=1, timeout_s=5)
            return done, base

    return anyio.run(session)


def test_mcp_slot_options_need_run(setup):
    """--slots/--devices/--executor say how this process would execute: refused without --run,
    before any database is opened."""
    from typer.testing import CliRunner

    from overnight.cli import app

    db, _ = setup
    for args in (["--slots", "2"], ["--devices", "0"], ["--executor", "ray"]):
        out = CliRunner().invoke(app, ["mcp", "--db", str(db), *args])
        assert out.exit_code == 2 and "only with --run" in out.output, (args, out.output)
    out = CliRunner().invoke(app, ["mcp", "--db", str(db), "--run", "--executor", "nomad"])
    assert out.exit_code == 2 and "--executor: expected 'local', 'ray' or 'slurm'" in out.output


def test_mcp_stdio_run_executes_without_a_service(setup):
    """`overnight mcp --run`: one config line for an agent; this process runs the queue."""
    db, _ = setup
    done, base = propose_width_over_stdio(["mcp", "--db", str(db), "--run"], timeout_s=60)
    assert base["status"] == "kept"
    assert done["status"] == "kept" and done["delta"] == pytest.approx(-0.1)
