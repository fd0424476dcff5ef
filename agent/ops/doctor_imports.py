"""Where a run imports the repository's own packages from: its worktree, or a shadowing copy.

A script run as `python projects/x/train.py` has only `projects/x` first on `sys.path`, so a
package at the repository's root (`mylib/`) comes from wherever else Python finds it: an
editable install of the user's checkout (`pip install -e .`), a `PYTHONPATH`, or nowhere
(`ModuleNotFoundError`). Then a proposal that edits `mylib/` never reaches the run. This module
asks the run's own interpreter, with the run's environment and folder and the `sys.path[0]`
the command gives it, where each package of the repository that the code imports comes from,
and says how to make it the worktree's: run the script as a module from the worktree's root
(`python -m projects.x.train`: the root first on `sys.path`), or put the root on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from agent.proposers.knob_chain import script_word
from agent.rules.contract import Check
from runner.environment import guest_environment

_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w., ]+))", re.MULTILINE)
_NOT_FOUND = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")
_ASK = """import importlib.metadata, importlib.util, json, sys
sys.path[0] = sys.argv[1]
out, dists = {}, {}
try:
    known = importlib.metadata.packages_distributions()
except Exception:
    known = {}
for name in sys.argv[2:]:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    where = None
    if spec is not None:
        where = spec.origin if spec.origin not in (None, "namespace") else next(
            iter(spec.submodule_search_locations or []), None)
    out[name], dists[name] = where, (known.get(name) or [None])[0]
print(json.dumps({"origins": out, "dists": dists}))
"""


@dataclass(frozen=True)
class ImportFacts:
    """The repository's packages a run imports, and where from (None: nowhere)."""

    command: str  # the target's command
    script: str  # the script, relative to the run's folder
    worktree: Path
    packages: dict[str, str]  # name -> its path in the repository
    origins: dict[str, str | None] = field(default_factory=dict)
    dists: dict[str, str | None] = field(default_factory=dict)  # name -> installed distribution
    pythonpath: str = ""

    def outside(self) -> dict[str, str]:
        """Packages imported from outside the worktree: name -> where from."""
        root = os.path.realpath(self.worktree)
        return {n: o for n, o in self.origins.items() if o is not None and
                not os.path.realpath(o).startswith(root + os.sep)}

    def missing(self) -> list[str]:
        return [n for n, o in self.origins.items() if o is None]


def repo_packages(root: Path, texts: list[str], script: str) -> dict[str, str]:
    """Top-level names the code imports that are packages or modules at the repository's root
    (or under `src/`), except the script's own folder (always first on its path)."""
    names = {name.strip().split(" ")[0].split(".")[0] for text in texts
             for a, b in _IMPORT.findall(text) for name in (a or b).split(",")}
    home = posixpath.dirname(script)
    found = {}
    for name in sorted(n for n in names if n):
        for base in ("", "src/"):
            if base.rstrip("/") == home:
                continue
            if (root / base / name / "__init__.py").is_file():
                found[name] = f"{base}{name}/"
            elif (root / base / f"{name}.py").is_file():
                found[name] = f"{base}{name}.py"
    return found


def import_facts(argv: list[str], cwd: Path, worktree: Path, env: dict[str, str],
                 command: str = "") -> ImportFacts | None:
    """Ask the run's interpreter (argv[0], a Python) where it would import the repository's
    packages from; None for a command that is not `python <script>` or `python -m <module>`."""
    at = script_word(argv)
    if at is None or not Path(argv[0]).name.startswith("python"):
        return None
    module = argv[at[0] - 1] == "-m"
    script = at[1]
    path = cwd / script
    if not path.is_file():
        return None
    texts = [path.read_text(errors="replace")]
    packages = repo_packages(worktree, texts, posixpath.normpath(
        os.path.relpath(path, worktree)))
    facts = ImportFacts(command or " ".join(argv), script, worktree, packages)
    if not packages:
        return facts
    first = str(cwd) if module else str(path.resolve().parent)
    child = guest_environment(os.environ, env)
    try:
        out = subprocess.run([argv[0], "-c", _ASK, first, *packages], cwd=cwd, env=child,
                             capture_output=True, text=True, timeout=60)
        data = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return facts
    return ImportFacts(facts.command, script, worktree, packages, data["origins"],
                       data["dists"], child.get("PYTHONPATH", ""))


def worktree_command(command: str, script: str) -> str | None:
    """The command that runs `script` as a module from the run's folder (the root first on
    sys.path), when its path is a module's name; None otherwise."""
    words = command.split()
    parts = script.removesuffix(".py").split("/")
    if not all(re.fullmatch(r"[A-Za-z_]\w*", p) for p in parts) or script not in words:
        return None
    at = words.index(script)
    return " ".join([*words[:at], "-m", ".".join(parts), *words[at + 1:]])


def _fix(facts: ImportFacts, names: list[str]) -> str:
    at_root = all("/" not in facts.packages[n].rstrip("/") for n in names)
    better = worktree_command(facts.command, facts.script) if at_root else None
    folder = "." if at_root else posixpath.dirname(facts.packages[names[0]].rstrip("/"))
    how = (f'command = "{better}" in overnight.toml (runs the script as a module: the '
           "worktree's root comes first on sys.path)" if better else
           f"run the script with {folder} on PYTHONPATH, e.g. command = "
           f'"env PYTHONPATH={folder} {facts.command}" (with the full path of your python)')
    dists = sorted({d for n in names if (d := facts.dists.get(n))})
    also = (f"; uninstalling the copy ({', '.join(f'pip uninstall {d}' for d in dists)}) is not "
            "enough alone: the script then finds no package" if dists else "")
    return how + also


def check_imports(facts: ImportFacts | None, editable: list[str]) -> Check | None:
    """✓ the run imports the repository's packages from its worktree, or ✗/! and the fix."""
    if facts is None or not facts.origins:
        return None
    outside, missing = facts.outside(), facts.missing()
    if not outside and not missing:
        return Check("imports", "ok", f"{', '.join(facts.packages)} from the run's worktree")
    if missing and not outside:
        return Check("imports", "fail", f"the run cannot import {', '.join(missing)}, this "
                     f"repository's own package ({', '.join(facts.packages[n] for n in missing)})"
                     f": `{facts.script}` puts only its own folder on sys.path",
                     _fix(facts, missing))
    where = "; ".join(f"{n} from {o} ({_how(facts, o)})" for n, o in outside.items())
    edited = [p for p in editable if any(p.startswith(facts.packages[n]) or
                                         p == facts.packages[n] for n in outside)]
    dead = (f": proposals that change {', '.join(edited)} never reach the run" if edited else
            ": the runs test that copy, not the commit")
    return Check("imports", "fail" if edited else "warn",
                 f"the run imports this repository's code from outside its worktree: {where}"
                 + dead, _fix(facts, list(outside)))


def _how(facts: ImportFacts, origin: str) -> str:
    paths = [p for p in facts.pythonpath.split(os.pathsep) if p]
    if any(os.path.realpath(origin).startswith(os.path.realpath(p) + os.sep) for p in paths):
        return "PYTHONPATH"
    dist = next((d for n, d in facts.dists.items() if d and facts.origins.get(n) == origin), None)
    return f"an installed copy: {dist}, e.g. pip install -e" if dist else \
        "an installed copy, e.g. pip install -e"


def missing_own_package(facts: ImportFacts | None, error: str | None) -> str | None:
    """The fix for a run that failed with ModuleNotFoundError of the repository's package."""
    m = _NOT_FOUND.search(error or "")
    if facts is None or m is None or m.group(1).split(".")[0] not in facts.packages:
        return None
    name = m.group(1).split(".")[0]
    return (f"{name} is this repository's own package ({facts.packages[name]}), but "
            f"`{facts.script}` puts only its own folder on sys.path: {_fix(facts, [name])}")
