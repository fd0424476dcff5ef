"""`overnight adopt`: turn an existing training repository into a target with few edits.

Finds the training entry point (a `__main__` block, argparse, hydra, or plain top-level code
with a training loop), the command the user really runs (`--command`, else the README's), its
local imports (evaluation and data modules are protected), the config files the command or
hydra selects, the command's flags (moved to an editable args_file so that a sweep can search
them), git-ignored data (also inside tracked folders) as assets, the metric and the progress
format, counts live and dead knobs (agent.proposers.knob_chain), and says what the script still
lacks of the contract with the lines to add and where (agent.ops.adopt_contract). Reads files
only; the CLI asks the questions and writes.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from agent.core.config import CONFIG_FILE
from agent.ops import adopt_command as cmdline
from agent.ops.adopt_contract import (
    Metric,
    Todo,
    find_metrics,
    free_name,
    lightning_todos,
    loop_todos,
    seed_todos,
    trainer_todos,
)
from agent.proposers.knob_chain import resolve

SKIP_DIRS = {".git", ".venv", "venv", "env", "__pycache__", "node_modules", "build", "dist",
             "tests", "test", ".tox", ".mypy_cache", ".pytest_cache"}
NOT_DATA = re.compile(r"(^|/)(out[\w-]*|logs?|wandb|runs|outputs|lightning_logs|checkpoints|"
                      r"\.ipynb_checkpoints|\.idea|\.vscode|__pycache__|[^/]*\.egg-info|"
                      r"\.DS_Store|[^/]*\.pyc|venv|\.venv|env|\.env)(/|$)")
PROTECTED_HINT = re.compile(r"eval|metric|score|data|prepare|dataset|corpus", re.IGNORECASE)
DATA_NAMES = ("data", "datasets", "dataset")
# Progress formats of well-known scripts: (a marker in the script's code, its progress_regex).
PROGRESS_FORMATS = (
    (r"iter \{\w+\}: loss", r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)"),  # nanoGPT
    (r"\bTrainer\(", r"\{'loss': '?(?P<loss>[\d.]+)'?"),  # Hugging Face Trainer's dict lines
    # Lightning's bars (tqdm: `train/loss=0.51`, rich: `train/loss: 0.51`) and tqdm postfixes
    (r"lightning|set_postfix|tqdm",
     r".*(?<![\d/])(?P<step>\d+)/\d+ .*?(?<![\w/])(?:train[/_])?loss[=:]\s*(?P<loss>[\d.]+)"),
    (r"\| epoch", r"(?P<step>\d+)/\s*\d+ batches .*loss\s+(?P<loss>[\d.]+)"),
    (r"Train Epoch:", r"Train Epoch: \d+ \[(?P<step>\d+)/\d+.*Loss: (?P<loss>[\d.]+)"),
)
_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w., ]+))", re.MULTILINE)
_TARGET = re.compile(r"_target_:\s*([\w.]+)\.\w+")


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
    knobs: int  # searched: live and not bookkeeping
    dead: list[str] = field(default_factory=list)  # "name at path:line: why"
    todo: list[str] = field(default_factory=list)
    args_file: str | None = None
    args_text: str = ""
    commands: list[str] = field(default_factory=list)  # the README's commands for the script
    full_command: str = ""  # the command as the user runs it (before the split)


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


def find_entry(root: Path) -> Path | None:
    scored = [(entry_score(p.read_text(errors="replace"), p.name), -len(p.parts), p)
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
        if NOT_DATA.search(path) or path in (CONFIG_FILE, cmdline.ARGS_FILE):
            continue
        top, base = path.split("/")[0], path.rsplit("/", 1)[-1]
        if top in DATA_NAMES or re.search(rf"(?<![\w.-]){re.escape(base)}(?![\w-])", text):
            found.append(path)
    return sorted(set(found))


def guess_direction(metric: str) -> str:
    return "maximize" if re.search(r"acc|f1|auc|score|bleu", metric, re.IGNORECASE) else "minimize"


def _render(todo: Todo) -> str:
    where = f"; {todo.where}" if todo.where else ""
    body = "".join(f"\n    | {line}" for line in todo.lines)  # verbatim after "| "
    return todo.what + where + (":" + body if todo.lines else "")


def contract_todo(text: str, metric: Metric | None) -> list[str]:
    """What the script still needs to honour the contract, each with the lines and where."""
    t0, budget = free_name(text, "overnight_t0"), free_name(text, "overnight_budget_s")
    todos: list[Todo] = []
    summary = re.search(r"print\(\s*['\"]---['\"]\s*\)", text)
    if "OVERNIGHT_BUDGET_S" not in text or not summary:
        try:
            todos = loop_todos(text, metric, t0, budget)
        except SyntaxError:
            todos = []
        if not todos and re.search(r"\bTrainer\(", text) and "transformers" in text:
            todos = trainer_todos(text, metric, t0, budget)
        if not todos and "lightning" in text:
            todos = lightning_todos(text, metric, t0, hydra="@hydra.main" in text)
        if not todos:
            name = metric.name if metric else "<metric>"
            todos = [Todo("read the training budget and stop when it is spent",
                          [f"{budget} = float(os.environ.get('OVERNIGHT_BUDGET_S', 'inf'))",
                           f"{t0} = time.time()", f"# in the batch loop: if time.time() - {t0} "
                           f"> {budget}: break"]),
                     Todo("print the summary block after evaluating",
                          ["print('---')", f"print(f'{name}: {{value:.6f}}')",
                           f"print(f'training_seconds: {{time.time() - {t0}:.1f}}')",
                           "print(f'num_steps: {steps}')"])]
    seeds = [] if "@hydra.main" in text and "lightning" in text else seed_todos(text)
    return [_render(t) for t in [*todos, *seeds]]


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


def _texts(root: Path, paths: list[str]) -> dict[str, str]:
    return {p: (root / p).read_text(errors="replace") for p in paths if (root / p).is_file()}


def _metric_sources(root: Path, script: Path, texts: dict[str, str]) -> list[str]:
    """The script, its local imports, and the modules hydra configs instantiate (`_target_`)."""
    modules = {m for t in texts.values() for m in _TARGET.findall(t)}
    paths = [p for m in sorted(modules) for p in (m.replace(".", "/") + ".py",)
             if (root / p).is_file()]
    return [script.relative_to(root).as_posix(), *local_imports(root, script), *paths]


def adopt(root: Path, script: Path | None = None, command: str | None = None,
          has_gpu: bool = False) -> Adoption:
    """Inspect a repository; raise ValueError when no entry point is found."""
    root = root.resolve()
    script = (root / script) if script else find_entry(root)
    if script is None or not script.is_file():
        raise ValueError(f"no training script found in {root} (a .py file with a training "
                         "loop, argparse, hydra or `if __name__ == '__main__'`); pass --script")
    text = script.read_text(errors="replace")
    rel = script.relative_to(root).as_posix()
    commands = cmdline.readme_commands(root, rel)
    full = command or cmdline.pick_command(commands, has_gpu) or f"python {rel}"
    base, arg_lines = cmdline.split_command(full)
    arg_lines = cmdline.with_trainer_defaults(arg_lines, text)
    if "@hydra.main" in text and "lightning" in text and "OVERNIGHT_BUDGET_S" not in text:
        arg_lines = cmdline.with_hydra_contract(arg_lines)
    imports = local_imports(root, script)
    protected = [p for p in imports if PROTECTED_HINT.search(Path(p).stem)]
    configs = cmdline.command_files(base, root) + cmdline.hydra_files(root, rel, arg_lines)
    args_file = cmdline.ARGS_FILE if arg_lines else None
    editable = [rel, *(p for p in imports if p not in protected), *configs,
                *([args_file] if args_file else [])]
    args_text = cmdline.args_file_text(arg_lines, rel) if arg_lines else ""
    files = {**_texts(root, editable), **({args_file: args_text} if args_file else {})}
    found = [m for p in _metric_sources(root, script, files)
             for m in find_metrics(files.get(p) or (root / p).read_text(errors="replace"))]
    metric = found[0] if found else None
    states = resolve(files, base, args_file)
    marker_text = "\n".join(files.values())
    progress = next((rx for marker, rx in PROGRESS_FORMATS if re.search(marker, marker_text)),
                    None)
    return Adoption(
        script=rel, command=base, editable=editable, protected=[*protected, CONFIG_FILE],
        assets=untracked_data(root, marker_text + "\n" + full),
        metric=metric.name if metric else None,
        direction=guess_direction(metric.name if metric else ""), progress_regex=progress,
        knobs=sum(s.searched for s in states),
        dead=[f"{s.knob.name} at {s.knob.where}: {s.why}" for s in states if not s.live],
        todo=_interpreter_todo(root, script, text, base) + contract_todo(text, metric),
        args_file=args_file, args_text=args_text,
        commands=commands, full_command=full)


def _interpreter_todo(root: Path, script: Path, text: str, command: str) -> list[str]:
    missing = missing_imports(root, script, text) if command.split()[0] in ("python",
                                                                            "python3") else []
    if not missing:
        return []
    return [f"`python` in command is overnight's own interpreter ({sys.executable}), which "
            f"lacks {', '.join(missing)}: write the interpreter that has them in command, e.g. "
            f"command = \"/path/to/your/venv/bin/python {command.split(' ', 1)[1]}\""]


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def render_toml(a: Adoption, budget_s: float = 300.0) -> str:
    command = a.command.replace("\\", "\\\\").replace('"', '\\"')
    lines = ["[target]", f'command   = "{command}"', f"editable  = {_toml_list(a.editable)}",
             f"protected = {_toml_list(a.protected)}", f'metric    = "{a.metric}"',
             f'direction = "{a.direction}"', f"budget_s  = {budget_s:g}"]
    if a.args_file:
        lines.append(f'args_file = "{a.args_file}"   # the command\'s flags: searched too')
    if a.assets:
        lines.append(f"assets    = {_toml_list(a.assets)}   # outside git: linked into each run")
    if a.progress_regex:
        quote = "'" * (3 if "'" in a.progress_regex else 1)  # a TOML literal string
        lines.append(f"progress_regex = {quote}{a.progress_regex}{quote}")
    return "\n".join(lines) + "\n"
