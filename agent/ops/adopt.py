"""`overnight adopt`: turn an existing training repository into a target with few edits.

Finds the training entry point (one that prints the metric), the command the user really runs
(`--command`, else the README's; `python -m pkg.script` when the script imports a package at
the repository's root, so runs import the worktree's copy), its local imports (the script's
folder and the repository's packages; evaluation and data modules are protected), the config
files the command or hydra selects, the command's flags (moved to an editable args_file so that
a sweep can search them), git-ignored data as assets, the metric and which way is better from
its name, counts live and dead knobs (agent.proposers.knob_chain), and says what the script
still lacks of the contract with the lines to add and where (agent.ops.adopt_contract). With a
probe it runs the command briefly from a throw-away worktree and offers a progress_regex only
if it fits lines the script printed. The CLI asks the questions and writes.

The command (pure text rules): the README's own `python <script> ...` lines are the best guess
of how a script is run (on a machine without a GPU, a line that mentions `cpu` first). The
words after the script split in two: the files it names (a Python config file exec'd over the
globals, a JSON file of arguments, which stay in `command`) and the flags (which go to the
`args_file`, one a line, so that a sweep can search them; bookkeeping ones are marked `knobs:
skip`). Hydra scripts: the config files their defaults list selects.

The repository: its training entry point, the modules it imports, data outside git, the
packages this interpreter lacks (files read, and git's list of ignored paths).

The probe (agent.ops.adopt_probe): the command runs briefly from a worktree of HEAD; what it
printed decides the progress_regex, where it imported the repository's packages from decides
the command, and a run that ended by itself gives budget_s its training time (naming the step
or epoch count that ended it, agent.ops.budget_caps). A script with no searchable knob is told,
in one sentence, how to give it some.
"""

from __future__ import annotations

import importlib.util
import posixpath
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from agent.core.config import CONFIG_FILE, args_words
from agent.ops.adopt_contract import (
    Metric,
    Todo,
    find_metrics,
    fit_progress,
    free_name,
    imports_todo,
    library_todos,
    lightning_todos,
    loop_todos,
    seed_todos,
    trainer_todos,
    training_loss,
)
from agent.ops.adopt_probe import Probe, budget_for, probe
from agent.ops.budget_caps import cap_advice, count_site, find_cap
from agent.ops.doctor import check_imports, repo_packages, worktree_command
from agent.proposers.knob_chain import (
    PLUMBING,
    KnobState,
    flag_key,
    resolve,
    script_word,
    takes_value,
)
from agent.proposers.knob_sources import how_to_give_knobs

# --- the command a user really runs, and the files it names -----------------------------------
ARGS_FILE = "overnight.args"
# Trainer arguments whose defaults live in the library: written out so a sweep can search them.
TRAINER_DEFAULTS = ("--learning_rate 5e-05", "--weight_decay 0.0", "--warmup_steps 0",
                    "--adam_beta2 0.999")
_FENCE_CMD = re.compile(r"^\s*(?:\$\s*)?((?:python3?|torchrun\b[^\n]*?)\s+\S+\.py\b[^\n`]*)", re.M)
_HYDRA_MAIN = re.compile(r"@hydra\.main\(([^)]*)\)")
_SKIP_GROUPS = {"hydra", "paths", "extras", "logger", "callbacks", "debug", "local",
                "experiment", "hparams_search", "launcher", "sweeper"}


def readme_commands(root: Path, script: str) -> list[str]:
    """`python <script> ...` lines of the repository's README, in order."""
    found: list[str] = []
    for readme in sorted(root.glob("README*")):
        for m in _FENCE_CMD.finditer(readme.read_text(errors="replace")):
            words = m.group(1).strip().split()
            at = next((i for i, w in enumerate(words) if w == script or w.endswith("/" + script)
                       or script.endswith("/" + w)), None)
            if at is None:
                continue
            words[at] = script  # run from the repository root, as the target's command is
            line = " ".join(words)
            if line not in found:
                found.append(line)
    return found


def pick_command(candidates: list[str], has_gpu: bool) -> str | None:
    if not candidates:
        return None
    if not has_gpu:
        cpu = [c for c in candidates if re.search(r"\bcpu\b", c)]
        if cpu:
            return cpu[0]
    return candidates[0]


def _is_file_word(word: str) -> bool:
    return not word.startswith("-") and "=" not in word and \
        word.endswith((".py", ".json", ".yaml", ".yml", ".toml"))


def split_command(command: str) -> tuple[str, list[str]]:
    """(`command` keeping the script and the files it names, the flags as args_file lines).

    A file named by a flag (`--config conf/a.yaml`) stays in the command with its flag.
    """
    words = shlex.split(command)
    found = script_word(words)
    if found is None:
        return command, []
    at = found[0]
    head, rest = words[: at + 1], words[at + 1:]
    files: list[str] = []
    lines: list[str] = []
    i = 0
    while i < len(rest):
        word = rest[i]
        nxt = rest[i + 1] if i + 1 < len(rest) else None
        if _is_file_word(word):
            files.append(word)
        elif word.startswith("-") and "=" not in word and _is_file_word(nxt or ""):
            files += [word, nxt or ""]
            i += 1
        elif word.startswith("-") and "=" not in word and takes_value(word, nxt):
            lines.append(f"{word} {shlex.quote(nxt or '')}")
            i += 1
        else:
            lines.append(word)
        i += 1
    marked = [f"{line}  # knobs: skip" if PLUMBING.match(
        flag_key(line.split("=", 1)[0].split(" ", 1)[0]).rsplit(".", 1)[-1].lower())
        else line for line in lines]
    return shlex.join(head + files), marked


def command_files(command: str, root: Path) -> list[str]:
    """Repository files the command names after its script (config files)."""
    words = shlex.split(command)
    at = (script_word(words) or (len(words), ""))[0]
    return [posixpath.normpath(w) for w in words[at + 1:]
            if _is_file_word(w) and (root / w).is_file()]


def hydra_files(root: Path, script: str, overrides: list[str]) -> list[str]:
    """The group config files a hydra script's defaults list (and `group=option` overrides)
    selects, except bookkeeping groups (paths, logger, callbacks, hydra, ...)."""
    m = _HYDRA_MAIN.search((root / script).read_text(errors="replace"))
    if not m:
        return []
    args = dict(re.findall(r"(\w+)\s*=\s*[\"']([^\"']+)[\"']", m.group(1)))
    base = posixpath.normpath(posixpath.join(posixpath.dirname(script),
                                             args.get("config_path", ".")))
    name = args.get("config_name", "config")
    primary = root / base / (name if name.endswith(".yaml") else name + ".yaml")
    if not primary.is_file():
        return []
    chosen = dict(re.findall(r"^\s*-\s*([\w/]+)\s*:\s*([\w/.-]+)\s*(?:#.*)?$",
                             primary.read_text(errors="replace"), re.M))
    for word in overrides:
        group, _, option = word.partition("=")
        if option and "." not in group and not group.startswith(("-", "+")):
            chosen[group] = option
    found = []
    for group, option in chosen.items():
        path = f"{base}/{group}/{option.removesuffix('.yaml')}.yaml"
        if group not in _SKIP_GROUPS and option != "null" and (root / path).is_file():
            found.append(path)
    return found


def with_trainer_defaults(lines: list[str], text: str) -> list[str]:
    """HfArgumentParser with TrainingArguments: its hyper-parameters not given yet, as lines."""
    if "TrainingArguments" not in text or "HfArgumentParser" not in text:
        return lines
    given = {flag_key(line.split()[0].split("=")[0]) for line in lines if line.strip()}
    return lines + [f"{d}  # Trainer default, written here so a sweep can search it"
                    for d in TRAINER_DEFAULTS if flag_key(d.split()[0]) not in given]


def with_hydra_contract(lines: list[str]) -> list[str]:
    """A Lightning + hydra script needs no code for the budget and the seed: two overrides."""
    keys = {line.split("=", 1)[0].lstrip("+") for line in lines}
    extra = []
    if "trainer.max_time" not in keys:
        extra.append("++trainer.max_time=00:00:00:${oc.env:OVERNIGHT_BUDGET_S}  # the budget")
    if "trainer.min_epochs" not in keys:  # fit ignores max_time until min_epochs are done
        extra.append("++trainer.min_epochs=0  # knobs: skip (else max_time waits for an epoch)")
    if "seed" not in keys:
        extra.append("seed=${oc.env:OVERNIGHT_SEED}  # the run's seed")
    return lines + extra


def args_file_text(lines: list[str], script: str) -> str:
    head = ("# Arguments appended to `command` for every run (overnight.toml: args_file).\n"
            "# A sweep may change the numbers below; `knobs: skip` keeps a line as it is.\n")
    return head + "".join(f"{line}\n" for line in lines)


# --- what the repository holds ----------------------------------------------------------------
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


CLI_WORDS = re.compile(r"\bargparse\b|add_argument|\bimport (?:typer|click|fire|jsonargparse)\b"
                       r"|\bfrom (?:typer|click|fire|jsonargparse)\b")


def entry_score(text: str, name: str = "") -> int:
    """How much a file looks like a training entry point."""
    score = 3 * ("__main__" in text) + 2 * bool(CLI_WORDS.search(text))
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


# --- adopt ------------------------------------------------------------------------------------
PROTECTED_HINT = re.compile(r"eval|metric|score|data|prepare|dataset|corpus", re.IGNORECASE)
# Words of a metric's name that say which way is better (the last such word decides).
MAXIMIZE = frozenset({"acc", "accuracy", "f1", "bleu", "rouge", "rougel", "reward", "rewards",
                      "return", "auc", "auroc", "map", "precision", "recall", "score", "iou",
                      "miou", "dice", "r2", "top1", "top5", "ndcg", "mrr", "psnr", "ssim",
                      "correct", "win", "exact"})
DEFAULT_BUDGET_S = 300.0  # budget_s when neither given nor learnt from the probe
MINIMIZE = frozenset({"loss", "error", "err", "perplexity", "ppl", "bpb", "bpc", "nll", "mse",
                      "mae", "rmse", "wer", "cer", "fid", "regret", "cost", "distance"})


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
    budget_s: float = 300.0  # given, or the probe's training time when it ended by itself
    no_knobs: str = ""  # with no searched knob: how to give the script some


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
          has_gpu: bool = False, metric: str | None = None, probe_s: float = 0.0,
          budget_s: float | None = None) -> Adoption:
    """Inspect a repository (and, with `probe_s`, run its command that long at most to see
    what it prints and how long it trains, which sets budget_s unless `budget_s` is given);
    raise ValueError when no entry point is found."""
    root = root.resolve()
    script = (root / script) if script else find_entry(root, metric)
    if script is None or not script.is_file():
        raise ValueError(f"no training script found in {root} (a .py file with a training "
                         "loop, a command line (argparse, typer, click, ...), hydra or "
                         "`if __name__ == '__main__'`); pass --script")
    text = script.read_text(errors="replace")
    rel = script.relative_to(root).as_posix()
    commands = readme_commands(root, rel)
    full = command or pick_command(commands, has_gpu) or f"python {rel}"
    base, arg_lines = split_command(full)
    arg_lines = with_trainer_defaults(arg_lines, text)
    if "@hydra.main" in text and "lightning" in text and "OVERNIGHT_BUDGET_S" not in text:
        arg_lines = with_hydra_contract(arg_lines)
    imports = local_imports(root, script)
    base, notes = _from_worktree(root, rel, text, base)
    protected = [p for p in imports if PROTECTED_HINT.search(Path(p).stem)]
    configs = command_files(base, root) + hydra_files(root, rel, arg_lines)
    args_file = ARGS_FILE if arg_lines else None
    editable = [rel, *(p for p in imports if p not in protected), *configs,
                *([args_file] if args_file else [])]
    args_text = args_file_text(arg_lines, rel) if arg_lines else ""
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
    searched = sum(s.searched for s in states)
    return Adoption(
        script=rel, command=base, editable=editable, protected=[*protected, CONFIG_FILE],
        assets=assets, metric=chosen.name if chosen else None, direction=direction,
        progress_regex=_progress(probed, notes), knobs=searched,
        dead=[f"{s.knob.name} at {s.knob.where}: {s.why}" for s in states if not s.live],
        todo=_interpreter_todo(root, script, text, base) + _probe_todo(probed, editable)
        + contract_todo(text, chosen, library),
        args_file=args_file, args_text=args_text, commands=commands, full_command=full,
        direction_why=why, notes=notes, probe=probed,
        budget_s=budget_s or _budget(probed, files, states, notes),
        no_knobs="" if searched else how_to_give_knobs(rel, text, base, adopted=str(root)))


def _budget(probed: Probe | None, files: dict[str, str], states: list[KnobState],
            notes: list[str]) -> float:
    """The probe's training time, rounded up, when it ended by itself; else DEFAULT_BUDGET_S."""
    trained = probed.trained_s if probed is not None else None
    if probed is None or trained is None:
        return DEFAULT_BUDGET_S
    budget = budget_for(trained)
    cap = find_cap({p: t for p, t in files.items() if p.endswith(".py")})
    why = f": {cap_advice(cap, count_site(cap, states))[0]}" if cap is not None else ""
    how = "trained" if "training_seconds" in probed.summary else "ran"
    notes.append(f"budget_s = {budget:g}: the probe's run {how} {trained:.1f} s and ended by "
                 f"itself{why}; runs with a longer budget end as early (pass --budget to choose "
                 "another)")
    return budget


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


def render_toml(a: Adoption, budget_s: float | None = None) -> str:
    budget_s = a.budget_s if budget_s is None else budget_s
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
