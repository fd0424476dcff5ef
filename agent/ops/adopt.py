"""`overnight adopt`: turn an existing training repository into a target with few edits.

Finds the training entry point (agent.ops.adopt_repo: one that prints the metric), the command
the user really runs (`--command`, else the README's; `python -m pkg.script` when the script
imports a package at the repository's root, so runs import the worktree's copy), its local
imports (the script's folder and the repository's packages; evaluation and data modules are
protected), the config files the command or hydra selects, the command's flags (moved to an
editable args_file so that a sweep can search them), git-ignored data as assets, the metric
and which way is better from its name, counts live and dead knobs
(agent.proposers.knob_chain), and says what the script still lacks of the contract with the
lines to add and where (agent.ops.adopt_contract, adopt_library for a loop in a library
module). With a probe (agent.ops.adopt_probe) it runs the command briefly from a throw-away
worktree and offers a progress_regex only if it fits lines the script printed. The CLI asks
the questions and writes.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from agent.core.config import CONFIG_FILE, args_words
from agent.ops import adopt_command as cmdline
from agent.ops.adopt_contract import (
    Metric,
    Todo,
    find_metrics,
    free_name,
    imports_todo,
    lightning_todos,
    loop_todos,
    seed_todos,
    trainer_todos,
    training_loss,
)
from agent.ops.adopt_library import library_todos
from agent.ops.adopt_probe import Probe, probe
from agent.ops.adopt_progress import PROGRESS_FORMATS, fit_progress
from agent.ops.adopt_repo import (
    find_entry,
    local_imports,
    metric_sources,
    missing_imports,
    sibling_imports,
    texts_of,
    untracked_data,
)
from agent.ops.doctor_imports import check_imports, repo_packages, worktree_command
from agent.proposers.knob_chain import resolve

PROTECTED_HINT = re.compile(r"eval|metric|score|data|prepare|dataset|corpus", re.IGNORECASE)
# Words of a metric's name that say which way is better (the last such word decides).
MAXIMIZE = frozenset({"acc", "accuracy", "f1", "bleu", "rouge", "rougel", "reward", "rewards",
                      "return", "auc", "auroc", "map", "precision", "recall", "score", "iou",
                      "miou", "dice", "r2", "top1", "top5", "ndcg", "mrr", "psnr", "ssim",
                      "correct", "win", "exact"})
MINIMIZE = frozenset({"loss", "error", "err", "perplexity", "ppl", "bpb", "bpc", "nll", "mse",
                      "mae", "rmse", "wer", "cer", "fid", "regret", "cost", "distance"})
__all__ = ["PROGRESS_FORMATS", "Adoption", "adopt", "missing_imports", "render_toml",
           "untracked_data"]


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
    direction_why: str = ""
    notes: list[str] = field(default_factory=list)  # what adopt decided for the user, and why
    probe: Probe | None = None


def direction_for(metric: str) -> tuple[str, str]:
    """(minimize | maximize, why): the last word of the metric's name that says which way."""
    for word in reversed(re.split(r"[^a-z0-9]+", metric.lower())):
        if word in MAXIMIZE or word in MINIMIZE:
            way = "maximize" if word in MAXIMIZE else "minimize"
            better = "higher" if way == "maximize" else "lower"
            return way, f"`{word}` in `{metric}`: {better} is better"
    return "minimize", (f"nothing in `{metric}` says which way is better: minimize assumed "
                        "(pass --direction maximize if higher is better)")


def _render(todo: Todo) -> str:
    where = f"; {todo.where}" if todo.where else ""
    body = "".join(f"\n    | {line}" for line in todo.lines)  # verbatim after "| "
    return todo.what + where + (":" + body if todo.lines else "")


def contract_todo(text: str, metric: Metric | None,
                  library: dict[str, str] | None = None) -> list[str]:
    """What the script still needs to honour the contract, each with the lines and where;
    `library`: the repository's modules it imports (path -> text), where its loop may live."""
    t0, budget = free_name(text, "overnight_t0"), free_name(text, "overnight_budget_s")
    todos: list[Todo] = []
    summary = re.search(r"print\(\s*['\"]---['\"]\s*\)", text)
    budgeted = "OVERNIGHT_BUDGET_S" in text or any("OVERNIGHT_BUDGET_S" in t
                                                   for t in (library or {}).values())
    if not budgeted or not summary:
        try:
            todos = loop_todos(text, metric, t0, budget)
        except SyntaxError:
            todos = []
        if not todos and library:
            todos = library_todos(text, library, metric)
        if not todos and re.search(r"\bTrainer\(", text) and "transformers" in text:
            todos = trainer_todos(text, metric, t0, budget)
        if not todos and "lightning" in text:
            todos = lightning_todos(text, metric, t0, hydra="@hydra.main" in text)
        if not todos:
            name = metric.name if metric else "<metric>"
            todos = [*imports_todo(text),
                     Todo("read the training budget and stop when it is spent",
                          [f"{budget} = float(os.environ.get('OVERNIGHT_BUDGET_S', 'inf'))",
                           f"{t0} = time.time()", f"# in the batch loop: if time.time() - {t0} "
                           f"> {budget}: break"]),
                     Todo("print the summary block after evaluating",
                          ["print('---')", f"print(f'{name}: {{value:.6f}}')",
                           f"print(f'training_seconds: {{time.time() - {t0}:.1f}}')",
                           "print(f'num_steps: {steps}')"])]
    seeds = [] if "@hydra.main" in text and "lightning" in text else seed_todos(text)
    return [_render(t) for t in [*todos, *seeds]]


def adopt(root: Path, script: Path | None = None, command: str | None = None,
          has_gpu: bool = False, metric: str | None = None, probe_s: float = 0.0) -> Adoption:
    """Inspect a repository (and, with `probe_s`, run its command that long at most to see
    what it prints); raise ValueError when no entry point is found."""
    root = root.resolve()
    script = (root / script) if script else find_entry(root, metric)
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
    base, notes = _from_worktree(root, rel, text, base)
    protected = [p for p in imports if PROTECTED_HINT.search(Path(p).stem)]
    configs = cmdline.command_files(base, root) + cmdline.hydra_files(root, rel, arg_lines)
    args_file = cmdline.ARGS_FILE if arg_lines else None
    editable = [rel, *(p for p in imports if p not in protected), *configs,
                *([args_file] if args_file else [])]
    args_text = cmdline.args_file_text(arg_lines, rel) if arg_lines else ""
    files = {**texts_of(root, editable), **({args_file: args_text} if args_file else {})}
    found = [m for p in metric_sources(root, script, files)
             for m in find_metrics(files.get(p) or (root / p).read_text(errors="replace"))]
    chosen = _choose_metric(found, metric, text, notes)
    direction, why = direction_for(chosen.name) if chosen else ("minimize", "")
    states = resolve(files, base, args_file)
    marker_text = "\n".join(files.values())
    assets = untracked_data(root, marker_text + "\n" + full)
    run = " ".join([base, *map(shlex.quote, args_words(args_text))])
    probed = probe(root, run, assets, probe_s) if probe_s > 0 else None
    library = {p: t for p, t in texts_of(root, imports).items() if p != rel}
    return Adoption(
        script=rel, command=base, editable=editable, protected=[*protected, CONFIG_FILE],
        assets=assets, metric=chosen.name if chosen else None, direction=direction,
        progress_regex=_progress(probed, notes), knobs=sum(s.searched for s in states),
        dead=[f"{s.knob.name} at {s.knob.where}: {s.why}" for s in states if not s.live],
        todo=_interpreter_todo(root, script, text, base) + _probe_todo(probed, editable)
        + contract_todo(text, chosen, library),
        args_file=args_file, args_text=args_text, commands=commands, full_command=full,
        direction_why=why, notes=notes, probe=probed)


def _from_worktree(root: Path, rel: str, text: str, base: str) -> tuple[str, list[str]]:
    """`python -m pkg.script` for a script below the root that imports a package at the root:
    run as a file, only its own folder is on sys.path, so the package would come from an
    installed copy (or nowhere) instead of the run's worktree."""
    packages = {n: p for n, p in repo_packages(root, [text], rel).items()
                if "/" not in p.rstrip("/")}  # at the root: `-m` puts the root on sys.path
    if not packages or "/" not in rel:
        return base, []
    better = worktree_command(base, rel)
    names = ", ".join(f"{n} ({p})" for n, p in packages.items())
    if better is None or sibling_imports(root, root / rel):
        return base, [f"{rel} imports {names} from this repository but runs with only its own "
                      "folder on sys.path: put the repository's root on PYTHONPATH for the runs "
                      "(doctor checks where the runs import it from)"]
    return better, [f"command runs {rel} as a module from the repository's root, so that each "
                    f"run imports {names} from its own worktree (which proposals change), not "
                    "from an installed copy (pip install -e) or not at all"]


def _choose_metric(found: list[Metric], wanted: str | None, text: str, notes: list[str]
                   ) -> Metric | None:
    if wanted:
        return next((m for m in found if m.name == wanted), Metric(wanted, wanted, "", 0))
    if found:
        return found[0]
    loss = training_loss(text)
    if loss is not None:
        notes.append(f"the script prints no metric on held-out data: adopt took its training "
                     f"loss, {loss.name} (line {loss.line}); a noisy measure of the last batches "
                     "that rewards overfitting: print a validation metric and pass --metric")
    return loss


def _progress(probed: Probe | None, notes: list[str]) -> str | None:
    """The progress_regex that fits the probe's lines (None: none fits, or none is needed)."""
    if probed is None:
        notes.append("no probe run (--probe 0): no progress_regex offered; `overnight doctor` "
                     "fits one to the lines the runs print")
        return None
    head = f"probe: ran the command {probed.wall_s:.1f} s ({probed.ended})"
    fit = fit_progress(probed.lines)
    if fit.default:
        notes.append(f"{head}; its progress lines need no progress_regex, e.g. `{fit.example}`")
    elif fit.regex:
        notes.append(f"{head}; progress_regex fits {fit.matched} of its {fit.lines} lines with "
                     f"a loss, e.g. `{fit.example}`")
    else:
        notes.append(f"{head}; it printed no line with a training loss that a regex fits, so "
                     "no progress_regex: the early stop of losing runs needs one (`overnight "
                     "doctor` says what to print)")
    return fit.regex


def _probe_todo(probed: Probe | None, editable: list[str]) -> list[str]:
    if probed is None:
        return []
    todo = []
    found = check_imports(probed.imports, editable)
    if found is not None and found.status != "ok":
        todo.append(f"{found.detail}: {found.fix}")
    if probed.error:
        todo.append(f"the probe run failed after {probed.wall_s:.1f} s: {probed.error} (run "
                    "`overnight doctor` once this file is committed, for the fix)")
    return todo


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
