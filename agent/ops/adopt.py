"""`overnight adopt`: turn an existing training repository into a target with few edits.

Finds the training entry point, its local imports (evaluation and data modules are protected),
data folders outside git (assets), the metric and the progress-line format, and writes
`overnight.toml`. Also says what the script still lacks of the contract. Reads files only;
the CLI asks the questions and writes.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from agent.core.config import CONFIG_FILE
from agent.proposers.knob_sources import find_knobs

SKIP_DIRS = {".git", ".venv", "venv", "env", "__pycache__", "node_modules", "build", "dist",
             "tests", "test", ".tox", ".mypy_cache", ".pytest_cache"}
PROTECTED_HINT = re.compile(r"eval|metric|score|data|prepare|dataset|corpus", re.IGNORECASE)
METRIC_HINT = re.compile(r"\b((?:val|valid|validation|test|eval)_?(?:loss|ppl|bpb|acc\w*|"
                         r"perplexity|error|f1))\b", re.IGNORECASE)
DATA_NAMES = ("data", "datasets", "dataset")
# Progress formats of well-known scripts -> a progress_regex for them.
PROGRESS_FORMATS = {
    "| epoch": r"(?P<step>\d+)/\s*\d+ batches .*loss\s+(?P<loss>[\d.]+)",
    "Train Epoch:": r"Train Epoch: \d+ \[(?P<step>\d+)/\d+.*Loss: (?P<loss>[\d.]+)",
}
_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w., ]+))", re.MULTILINE)


@dataclass
class Adoption:
    """What adopt found (and the CLI may override)."""

    script: str
    command: str
    editable: list[str]
    protected: list[str]
    assets: list[str]
    metric: str | None
    direction: str
    progress_regex: str | None
    knobs: int
    todo: list[str] = field(default_factory=list)


def _python_files(root: Path) -> list[Path]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if not SKIP_DIRS.intersection(rel.parts[:-1]):
            found.append(path)
    return found


def entry_score(text: str) -> int:
    """How much a file looks like a training entry point."""
    score = 3 * ("__main__" in text) + 2 * ("argparse" in text or "add_argument" in text)
    score += 2 * bool(re.search(r"\.backward\(|optimizer\.step\(|\bfor\s+epoch\b", text))
    score += bool(re.search(r"\btrain", text))
    return score


def find_entry(root: Path) -> Path | None:
    scored = [(entry_score(p.read_text(errors="replace")), -len(p.parts), p)
              for p in _python_files(root)]
    scored = [s for s in scored if s[0] >= 4]
    return max(scored)[2] if scored else None


def local_imports(root: Path, script: Path) -> list[str]:
    """Repository-relative paths of the modules the script imports from its own folder."""
    names = set()
    for a, b in _IMPORT.findall(script.read_text(errors="replace")):
        for name in (a or b).split(","):
            names.add(name.strip().split(" ")[0].split(".")[0])
    paths = [script.parent / f"{n}.py" for n in sorted(names) if n]
    return [p.relative_to(root).as_posix() for p in paths if p.is_file() and p != script]


def untracked_data(root: Path, text: str) -> list[str]:
    """Data folders present on disk but not in git: the script's data, an asset."""
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True,
                             text=True).stdout.split()
    top = {t.split("/")[0] for t in tracked}
    return [n for n in DATA_NAMES if (root / n).exists() and n not in top]


def guess_metric(text: str) -> str | None:
    found = METRIC_HINT.findall(text)
    return found[0] if found else None


def guess_direction(metric: str) -> str:
    return "maximize" if re.search(r"acc|f1|auc|score|bleu", metric, re.IGNORECASE) else "minimize"


def contract_todo(text: str, metric: str | None) -> list[str]:
    """What the script still needs to honour the contract, each with the lines to add."""
    todo = []
    if "OVERNIGHT_BUDGET_S" not in text:
        todo.append(
            "read the training budget and stop when it is spent, e.g. after the imports:\n"
            "    budget_s = float(os.environ.get('OVERNIGHT_BUDGET_S', 'inf'))\n"
            "    t0 = time.time()\n"
            "  and in the batch loop:  if time.time() - t0 > budget_s: break")
    if not re.search(r"print\(\s*['\"]---['\"]\s*\)", text):
        todo.append(
            "print the summary block after evaluating:\n"
            "    print('---')\n"
            f"    print(f'{metric or '<metric>'}: {{value:.6f}}')\n"
            "    print(f'training_seconds: {time.time() - t0:.1f}')")
    return todo


def adopt(root: Path, script: Path | None = None) -> Adoption:
    """Inspect a repository; raise ValueError when no entry point is found."""
    root = root.resolve()
    script = (root / script) if script else find_entry(root)
    if script is None or not script.is_file():
        raise ValueError(f"no training script found in {root} (a .py file with argparse or "
                         "`if __name__ == '__main__'` and a training loop); pass --script")
    text = script.read_text(errors="replace")
    rel = script.relative_to(root).as_posix()
    imports = local_imports(root, script)
    protected = [p for p in imports if PROTECTED_HINT.search(Path(p).stem)]
    editable = [rel] + [p for p in imports if p not in protected]
    metric = guess_metric(text)
    progress = next((rx for marker, rx in PROGRESS_FORMATS.items() if marker in text), None)
    return Adoption(
        script=rel, command=f"python {rel}", editable=editable,
        protected=[*protected, CONFIG_FILE], assets=untracked_data(root, text), metric=metric,
        direction=guess_direction(metric or ""), progress_regex=progress,
        knobs=len(find_knobs(rel, text)), todo=contract_todo(text, metric))


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def render_toml(a: Adoption, budget_s: float = 300.0) -> str:
    lines = ["[target]", f'command   = "{a.command}"', f"editable  = {_toml_list(a.editable)}",
             f"protected = {_toml_list(a.protected)}", f'metric    = "{a.metric}"',
             f'direction = "{a.direction}"', f"budget_s  = {budget_s:g}"]
    if a.assets:
        lines.append(f"assets    = {_toml_list(a.assets)}   # outside git: linked into each run")
    if a.progress_regex:
        lines.append(f"progress_regex = '{a.progress_regex}'")
    return "\n".join(lines) + "\n"
