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
FORBIDDEN = {
    "runner/*.py": {"agent", "db", "api", "torch", "sqlalchemy", "fastapi", "git"},
    "agent/domain.py": {"db", "api", "sqlalchemy", "fastapi", "git", "httpx"},
    "agent/config.py": {"db", "api", "sqlalchemy", "fastapi", "git"},
    "agent/admit.py": {"db", "api", "sqlalchemy", "fastapi", "git"},
    "agent/classify.py": {"db", "api", "sqlalchemy", "fastapi", "git"},
    "agent/decide.py": {"db", "api", "sqlalchemy", "fastapi", "git"},
    "agent/gate.py": {"db", "api", "sqlalchemy", "fastapi", "git", "apscheduler"},
    "agent/loop.py": {"db", "api", "sqlalchemy", "fastapi"},
    "agent/training.py": {"db", "api", "sqlalchemy", "fastapi", "git"},
    "agent/sweeps.py": {"db", "api", "sqlalchemy", "fastapi"},
    "db/*.py": {"api"},
    "experiments/gpt/*.py": {"agent", "db", "api", "runner"},
}


@pytest.mark.parametrize("pattern", sorted(FORBIDDEN))
def test_import_directions(pattern: str):
    files = sorted(ROOT.glob(pattern))
    assert files, pattern
    for f in files:
        bad = imports_of(f) & FORBIDDEN[pattern]
        assert not bad, f"{f.relative_to(ROOT)} imports {sorted(bad)}"


def test_nothing_outside_the_cli_imports_api():
    for f in sorted((ROOT / "agent").rglob("*.py")) + sorted((ROOT / "db").rglob("*.py")):
        if f.name.startswith("cli") or f.name == "mcp_server.py":
            continue
        assert "api" not in imports_of(f), f"{f.relative_to(ROOT)} imports api"


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
