"""What a repository holds for adopt: its training entry point, the modules it imports, data
outside git, the packages this interpreter lacks. Reads files (and git's list of ignored paths).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

from agent.core.config import CONFIG_FILE
from agent.ops.adopt_command import ARGS_FILE
from agent.ops.adopt_contract import find_metrics

SKIP_DIRS = {".git", ".venv", "venv", "env", "__pycache__", "node_modules", "build", "dist",
             "tests", "test", ".tox", ".mypy_cache", ".pytest_cache"}
NOT_DATA = re.compile(r"(^|/)(out[\w-]*|logs?|wandb|runs|outputs|lightning_logs|checkpoints|"
                      r"\.ipynb_checkpoints|\.idea|\.vscode|__pycache__|[^/]*\.egg-info|"
                      r"\.DS_Store|[^/]*\.pyc|venv|\.venv|env|\.env)(/|$)")
DATA_NAMES = ("data", "datasets", "dataset")
_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w., ]+))", re.MULTILINE)
_TARGET = re.compile(r"_target_:\s*([\w.]+)\.\w+")


def _python_files(root: Path) -> list[Path]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if not SKIP_DIRS.intersection(rel.parts[:-1]):
            found.append(path)
    return found


def entry_score(text: str, name: str = "") -> int:
    """How much a file looks like a training entry point."""
    score = 3 * ("__main__" in text) + 2 * ("argparse" in text or "add_argument" in text)
    score += 2 * bool(re.search(r"\.backward\(|optimizer\.step\(|\bfor\s+epoch\b", text))
    score += 2 * bool(re.search(r"@hydra\.main|\btrainer\.(fit|train)\(|\bTrainer\(", text))
    score += 2 * bool(re.search(r"^(while|for)\b", text, re.M) and ".backward(" in text)
    score += bool(re.search(r"\btrain", text)) + bool(re.match(r"(train|main|run)\w*\.py$", name))
    return score


def prints_metric(text: str, metric: str | None) -> bool:
    """Does this code print `metric` (any metric when None)?"""
    found = find_metrics(text)
    if metric is None:
        return bool(found)
    printed = r"[ _/]".join(re.escape(w) for w in re.split(r"[ _/]", metric))
    return any(m.name == metric for m in found) or bool(re.search(rf"\b{printed}\b", text))


def find_entry(root: Path, metric: str | None = None) -> Path | None:
    """The training entry point: of the files that look like one, one that prints the metric."""
    scored = []
    for path in _python_files(root):
        text = path.read_text(errors="replace")
        score = entry_score(text, path.name)
        if score >= 4:
            sources = [text, *texts_of(root, sibling_imports(root, path)).values()]
            scored.append((any(prints_metric(s, metric) for s in sources), score,
                           -len(path.parts), path))
    return max(scored)[3] if scored else None


def _imported(text: str) -> set[str]:
    """Dotted module names a file imports (`from a.b import c` also gives `a.b.c`)."""
    names = set()
    for line in text.splitlines():
        m = re.match(r"\s*from\s+([\w.]+)\s+import\s+([\w, ]+)", line)
        if m:
            names |= {m.group(1)} | {f"{m.group(1)}.{n.strip().split(' ')[0]}"
                                     for n in m.group(2).split(",") if n.strip()}
            continue
        m = re.match(r"\s*import\s+([\w., ]+)", line)
        if m:
            names |= {n.strip().split(" ")[0] for n in m.group(1).split(",") if n.strip()}
    return names


def sibling_imports(root: Path, script: Path) -> list[str]:
    """Repository-relative paths of the modules the script imports from its own folder."""
    names = {n.split(".")[0] for n in _imported(script.read_text(errors="replace"))}
    paths = [script.parent / f"{n}.py" for n in sorted(names) if n]
    return [p.relative_to(root).as_posix() for p in paths if p.is_file() and p != script]


def local_imports(root: Path, script: Path, limit: int = 30) -> list[str]:
    """The modules of the repository the script imports: from its own folder, and the modules
    of the repository's packages (`from mylib.trainer import Trainer`), followed through them."""
    found = sibling_imports(root, script)
    todo = [script]
    seen = {script}
    while todo and len(found) < limit:
        text = todo.pop(0).read_text(errors="replace")
        for name in sorted(_imported(text)):
            for path in (root / (name.replace(".", "/") + ".py"),
                         root / "src" / (name.replace(".", "/") + ".py")):
                if path.is_file() and path not in seen and path.stat().st_size > 0:
                    seen.add(path)
                    todo.append(path)
                    rel = path.relative_to(root).as_posix()
                    if rel not in found and not SKIP_DIRS.intersection(Path(rel).parts[:-1]):
                        found.append(rel)
    return found


def _git_paths(root: Path, *args: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "--others", "--directory", *args], cwd=root,
                         capture_output=True, text=True).stdout
    return [line.rstrip("/") for line in out.splitlines() if line.strip()]


def untracked_data(root: Path, text: str) -> list[str]:
    """Data outside git that the run reads: git-ignored paths (inside tracked folders too)
    named in the script, its configs or its command, and untracked `data/` folders."""
    ignored = _git_paths(root, "--ignored", "--exclude-standard")
    untracked = _git_paths(root, "--exclude-standard")
    found = []
    for path in ignored + untracked:
        if NOT_DATA.search(path) or path in (CONFIG_FILE, ARGS_FILE):
            continue
        top, base = path.split("/")[0], path.rsplit("/", 1)[-1]
        if top in DATA_NAMES or re.search(rf"(?<![\w.-]){re.escape(base)}(?![\w-])", text):
            found.append(path)
    return sorted(set(found))


def missing_imports(root: Path, script: Path, text: str) -> list[str]:
    """Top-level packages the script imports that this interpreter cannot find (nor the repo)."""
    names = {(a or b).split(",")[0].strip().split(" ")[0].split(".")[0]
             for a, b in _IMPORT.findall(text)}
    local = {p.name.removesuffix(".py") for p in [*script.parent.iterdir(), *root.iterdir()]}
    missing = []
    for name in sorted(n for n in names if n and n not in local):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return missing


def texts_of(root: Path, paths: list[str]) -> dict[str, str]:
    return {p: (root / p).read_text(errors="replace") for p in paths if (root / p).is_file()}


def metric_sources(root: Path, script: Path, texts: dict[str, str]) -> list[str]:
    """The script, its local imports, and the modules hydra configs instantiate (`_target_`)."""
    modules = {m for t in texts.values() for m in _TARGET.findall(t)}
    paths = [p for m in sorted(modules) for p in (m.replace(".", "/") + ".py",)
             if (root / p).is_file()]
    return [script.relative_to(root).as_posix(), *local_imports(root, script), *paths]
