"""The codebase's own rules: lint, types, and the allowed import directions."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


# package (or module glob) -> top-level names it must never import
ADAPTERS = {"git", "sqlalchemy", "fastapi", "httpx", "apscheduler", "ray", "uvicorn", "mlflow",
            "wandb"}
TRACKERS = {"mlflow", "wandb"}
ABOVE_AGENT = {"db", "api", "overnight"}
FORBIDDEN = {
    "runner/*.py": {"agent", "db", "api", "torch", "sqlalchemy", "fastapi", "git"},
    # the vocabulary and the pure decisions: no adapter of any kind
    "agent/core/*.py": ABOVE_AGENT | ADAPTERS,
    "agent/rules/*.py": ABOVE_AGENT | ADAPTERS | {"runner"},
    "agent/analysis/*.py": ABOVE_AGENT | ADAPTERS | {"runner"},
    "agent/proposers/*.py": ABOVE_AGENT | ADAPTERS - {"httpx"},  # a chat model over HTTP
    "agent/git/*.py": ABOVE_AGENT | ADAPTERS - {"git"},
    "agent/executors/*.py": ABOVE_AGENT | ADAPTERS - {"ray"},
    "agent/ops/*.py": ABOVE_AGENT | ADAPTERS - TRACKERS,  # the trackers' mirror (agent.ops.track)
    "agent/engine/*.py": ABOVE_AGENT | ADAPTERS - {"apscheduler"},
    "db/**/*.py": {"api", "overnight"},
    "experiments/gpt/*.py": {"agent", "db", "api", "runner"},
}

@pytest.mark.parametrize("pattern", sorted(FORBIDDEN))
def test_import_directions(pattern: str):
    files = sorted(ROOT.glob(pattern))
    assert files, pattern
    for f in files:
        bad = imports_of(f) & FORBIDDEN[pattern]
        assert not bad, f"{f.relative_to(ROOT)} imports {sorted(bad)}"


# The floors of the house, top to bottom: nothing imports a package on a higher floor.
FLOORS = {"overnight": 5, "api": 4, "db": 3, "agent": 2, "runner": 1}


def test_no_import_runs_back_up_the_floors():
    """overnight/ -> api/ -> db/ -> agent/ -> runner/, no file exempt (lazy imports included)."""
    bad = []
    for pkg, floor in FLOORS.items():
        for f in sorted((ROOT / pkg).rglob("*.py")):
            above = {n for n in imports_of(f) if FLOORS.get(n, 0) > floor}
            bad += [f"{f.relative_to(ROOT)} imports {n}" for n in sorted(above)]
    assert not bad, "\n".join(bad)


def module_graph() -> dict[str, set[str]]:
    """First-party module -> the first-party modules it imports (anywhere in the file)."""
    files = {}
    for pkg in FLOORS:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            files[name] = f
    graph: dict[str, set[str]] = {}
    for name, f in files.items():
        edges = set()
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            else:
                continue
            edges |= {t for t in targets if t in files and t != name}
        graph[name] = edges
    return graph


def test_no_import_cycles():
    graph = module_graph()
    assert "overnight.runtime" in graph and "agent.engine.loop" in graph
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles: list[str] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


def _tool(name: str) -> str:
    exe = BIN / name
    if not exe.exists():
        found = shutil.which(name)
        assert found, f"{name} is a dev dependency (pip install -e '.[dev]')"
        return found
    return str(exe)


def test_ruff_is_clean():
    proc = subprocess.run([_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_is_clean():
    proc = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_service_runs_without_torch():
    """torch is the trainer's dependency: the CLI, the API and the engine never import it."""
    code = ("import sys, overnight.cli, overnight.runtime, api.main, agent.engine.scheduler, "
            "agent.engine.loop, db.store; print(sorted(m for m in ('torch', 'numpy') if m in "
            "sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "[]"


def test_the_coordinator_runs_without_ray():
    """Ray is the `ray` extra: nothing imports it until executor 'ray' is asked for, and then
    its absence is one readable error."""
    code = (
        "import sys; sys.modules['ray'] = None\n"  # as if not installed: `import ray` fails
        "import overnight.cli, overnight.runtime, api.main, agent.executors.ray\n"
        "from agent.core.errors import ConfigError\n"
        "from agent.executors.ray import RayExecutor, RaySettings\n"
        "try:\n"
        "    RayExecutor(RaySettings()).connect()\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "executor 'ray' needs Ray on the coordinator: pip install 'overnight[ray]'"


def test_the_service_runs_without_the_trackers():
    """MLflow and W&B are the `mlflow` and `wandb` extras: nothing imports them until a sweep is
    mirrored, and then their absence is one readable error."""
    code = (
        "import sys\n"
        "import overnight.cli, overnight.runtime, api.main, agent.ops.track\n"
        "print(sorted(m for m in ('mlflow', 'wandb') if m in sys.modules))\n"
        "sys.modules['mlflow'] = sys.modules['wandb'] = None  # as if not installed\n"
        "from agent.core.tracking import TrackTable\n"
        "from agent.ops.track import make_tracker\n"
        "from agent.ops.track_record import TrackerError\n"
        "for to in ('mlflow', 'wandb'):\n"
        "    try:\n"
        "        make_tracker(TrackTable(to=to))\n"
        "    except TrackerError as exc:\n"
        "        print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out == ["[]", "tracking to MLflow needs MLflow: pip install 'overnight[mlflow]'",
                   "tracking to W&B needs wandb: pip install 'overnight[wandb]'"]


# The wings of agent/, bottom to top: a wing imports only wings below it (or beside it, on
# the same level, when no circle results), so no folder-level loop can form.
WINGS = {"core": 1, "rules": 2, "git": 3, "analysis": 3, "executors": 4, "proposers": 4,
         "ops": 5, "engine": 6}


def test_agent_is_wings_only():
    loose = sorted(f.name for f in (ROOT / "agent").glob("*.py") if f.name != "__init__.py")
    assert not loose, f"modules outside a wing: {loose}"
    assert {d.name for d in (ROOT / "agent").iterdir()
            if d.is_dir() and (d / "__init__.py").exists()} == set(WINGS)


def test_the_wings_import_only_downwards():
    """analysis/ never imports proposers/ (the digest is for them, not of them); the engine sits
    on top; nothing imports a wing on its own level or above, so folders have no loops."""
    bad = []
    for a, targets in module_graph().items():
        pa = a.split(".")
        if pa[0] != "agent" or len(pa) < 3:
            continue
        for b in targets:
            pb = b.split(".")
            if pb[0] == "agent" and len(pb) >= 3 and pb[1] != pa[1] \
                    and WINGS[pb[1]] >= WINGS[pa[1]]:
                bad.append(f"{a} imports {b}")
    assert not bad, "\n".join(sorted(bad))


def _reads_overnight_variable(node: ast.AST) -> bool:
    """os.environ["OVERNIGHT_…"], os.environ.get("OVERNIGHT_…"), os.getenv("OVERNIGHT_…")."""
    def named(arg: ast.AST | None) -> bool:
        return isinstance(arg, ast.Constant) and str(arg.value).startswith("OVERNIGHT_")

    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
        return node.value.attr == "environ" and named(node.slice)
    if isinstance(node, ast.Call) and node.args:
        f = node.func
        getter = isinstance(f, ast.Attribute) and (
            f.attr == "getenv" or (f.attr == "get" and isinstance(f.value, ast.Attribute)
                                   and f.value.attr == "environ"))
        return getter and named(node.args[0])
    return False


def test_only_the_composition_root_reads_the_environment():
    """overnight's own OVERNIGHT_* settings are read in overnight/ (overnight/environment.py)
    and handed down; below it nothing reads one, nor imports pydantic-settings."""
    bad = []
    for pkg in ("agent", "api", "db", "runner"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(f.read_text(encoding="utf-8"))
            if any(_reads_overnight_variable(n) for n in ast.walk(tree)):
                bad.append(f"{f.relative_to(ROOT)} reads an OVERNIGHT_* variable")
            if "pydantic_settings" in imports_of(f):
                bad.append(f"{f.relative_to(ROOT)} imports pydantic_settings")
    assert not bad, "\n".join(bad)
    assert _reads_overnight_variable(ast.parse('os.environ.get("OVERNIGHT_DB")').body[0].value)
