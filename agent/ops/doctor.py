"""`overnight doctor`: run a target's unmodified HEAD at a short budget and check its contract.

Runs the command twice, with seeds seed and seed + 1 as a sweep's baseline does, in a throw-away
worktree (assets linked as for a sweep), outside any database (with --db its logs are kept in
the database's work folder); the checks themselves are agent.rules.contract's pure functions
(the summary, the budget, is the seed used, where does the throughput come from). A run that
trained less than half its budget although the script reads it is told the step or epoch count
that ends training first, with its file and line (agent.ops.budget_caps).

The knob checks: every knob, where it is set and whether a change to it reaches the run.
Static, from the override chain (agent.proposers.knob_chain): each knob with its file and line,
searched / bookkeeping / dead (and what wins); the command's flags that override editable
values, in every config style. Cheap and dynamic, from the first run's log: a searched knob
whose name the run printed only with another value (the effective config a script prints:
nanoGPT's `Overriding: lr = ...`, `print(vars(args))`, Trainer's arguments, hydra's tree) is
overridden somewhere the chain cannot see. A run that failed on a missing file that is
git-ignored in the checkout: it belongs in `assets`. And progress lines no regex reads: the
progress_regex that fits the lines the run printed (agent.ops.adopt_contract), or what to print
and where (the training loop's file and line).

Where a run imports the repository's own packages from: its worktree, or a shadowing copy. A
script run as `python projects/x/train.py` has only `projects/x` first on `sys.path`, so a
package at the repository's root (`mylib/`) comes from wherever else Python finds it: an
editable install of the user's checkout (`pip install -e .`), a `PYTHONPATH`, or nowhere
(`ModuleNotFoundError`). Then a proposal that edits `mylib/` never reaches the run. The run's
own interpreter is asked, with the run's environment and folder and the `sys.path[0]` the
command gives it, where each package of the repository that the code imports comes from, and
the check says how to make it the worktree's: run the script as a module from the worktree's
root (`python -m projects.x.train`: the root first on `sys.path`), or put the root on
PYTHONPATH. adopt asks the same (agent.ops.adopt).
"""

from __future__ import annotations

import ast
import json
import math
import os
import posixpath
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

from agent.core.config import CONFIG_FILE, TargetConfig, extra_args
from agent.git.repo import GitRepo
from agent.ops.adopt_contract import fit_progress, training_loop
from agent.ops.budget_caps import short_run
from agent.ops.sweeps import asset_hashes, dirty_files, link_assets
from agent.proposers.knob_chain import KnobState, flag_key, parse_words, resolve, script_word
from agent.proposers.knob_sources import how_to_give_knobs
from agent.rules.contract import (
    Check,
    RunFacts,
    check_early_stop,
    check_evaluation,
    check_noise,
    check_run,
    check_seed,
    check_speed,
)
from agent.rules.placement import Sample
from agent.rules.throughput import ProgressMeter, speed
from runner.environment import guest_environment
from runner.process import resolve_command, run_command
from runner.result import Outcome, RunResult
from runner.summary import parse_progress

# --- where a run imports the repository's packages from ---------------------------------------
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


# Import names whose distribution on PyPI is called something else.
_DISTRIBUTIONS = {"cv2": "opencv-python", "PIL": "pillow", "sklearn": "scikit-learn",
                  "skimage": "scikit-image", "yaml": "pyyaml", "bs4": "beautifulsoup4",
                  "attr": "attrs", "google.protobuf": "protobuf", "dotenv": "python-dotenv"}


def missing_dependency(config: TargetConfig, error: str | None, repo: Path) -> str | None:
    """The fix for a run that failed with ModuleNotFoundError of another project's module: it
    is not installed for the interpreter the command runs with. None for a module of `repo`
    itself (missing_own_package's case)."""
    m = _NOT_FOUND.search(error or "")
    if m is None:
        return None
    name = m.group(1)
    top = name.split(".")[0]
    if any((repo / base / top).is_dir() or (repo / base / f"{top}.py").is_file()
           for base in ("", "src")):
        return None
    dist = _DISTRIBUTIONS.get(name) or _DISTRIBUTIONS.get(top) or top
    python = resolve_command(config.command)[0]
    if not os.path.basename(python).startswith("python"):  # a wrapper: bash run.sh, uv run, ...
        return (f"{name} is not installed in the Python environment `{config.command}` runs "
                f"in: install {dist} there (its name on PyPI may differ from the module's)")
    return (f"{name} is not installed for the interpreter the command runs with ({python}): "
            f"install it there, e.g. `{shlex.quote(python)} -m pip install {dist}` (its name "
            "on PyPI may differ from the module's)")


# --- the knob checks --------------------------------------------------------------------------
_MISSING = re.compile(r"No such file or directory: '([^']+)'")
_NUM = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"


def knob_states(config: TargetConfig, files: dict[str, str]) -> list[KnobState]:
    return resolve(files, config.command, config.args_file, config.workdir)


def _state_line(s: KnobState) -> Check:
    k = s.knob
    where = f"{k.name} = {k.raw} ({k.where})"
    if not s.live:
        return Check("knob", "info", f"{where}: dead, {s.why}")
    if s.plumbing:
        return Check("knob", "info", f"{where}: live, not searched (a machine or bookkeeping "
                                     "setting)")
    if isinstance(k.value, str):
        return Check("knob", "info", f"{where}: live, not searched (text)")
    return Check("knob", "ok", f"{where}: searched")


def knob_checks(config: TargetConfig, files: dict[str, str]) -> list[Check]:
    """The knob summary, the command's overriding flags, then one line per knob."""
    editable = set(config.editable) | {config.args_file}
    states = [s for s in knob_states(config, files) if s.knob.path in editable]
    searched = sum(s.searched for s in states)
    dead = [s for s in states if not s.live]
    summary = Check("knobs", "ok" if searched else "warn",
                    f"{searched} searched, {len(dead)} dead, "
                    f"{len(states) - searched - len(dead)} not searched (bookkeeping or text)",
                    "" if searched else _no_knobs_fix(config, files, bool(dead)))
    by_command = sorted({s.why.split(":")[0].removeprefix("the command sets ")
                         for s in dead if s.why.startswith("the command sets")})
    checks = [summary]
    if by_command:
        checks.append(Check(
            "command flags", "warn",
            f"`{config.command}` sets {', '.join(by_command)}: changes to those values in the "
            "editable files cannot reach the run",
            "move those flags into an editable args_file (overnight.toml: args_file = "
            "\"overnight.args\", listed in editable too; one flag a line) so a sweep can "
            "search them, or drop them from `command`"))
    return checks + [_state_line(s) for s in states]


def _no_knobs_fix(config: TargetConfig, files: dict[str, str], dead: bool) -> str:
    """What to do when nothing is searched: what wins over the dead knobs listed below, or
    how to give the script knobs at all."""
    if dead:
        return ("nothing for the knobs proposer to change: see the dead knobs below for what "
                "wins, or use --proposer llm:<profile>")
    script = parse_words(shlex.split(config.command), config.workdir).script or "the script"
    return (f"nothing for the knobs proposer to change: "
            f"{how_to_give_knobs(script, files.get(script, ''), config.command)}; or use "
            "--proposer llm:<profile>")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def printed_values(states: list[KnobState], log: str) -> list[Check]:
    """Searched knobs the run's start-up printed only with a different value."""
    head = log[: 200_000]
    wrong = []
    for s in (s for s in states if s.searched):
        key = flag_key(s.knob.name).rsplit(".", 1)[-1]
        pattern = (rf"(?<![\w.]){re.escape(key)}['\"]?\s*(?:=|:)\s*['\"]?"
                   rf"({_NUM}|True|False|true|false)\b")
        seen = re.findall(pattern, head)
        if not seen:
            continue
        values = [float(v in ("True", "true")) if v.lower() in ("true", "false") else float(v)
                  for v in seen]
        mine = float(s.knob.value)
        if not any(_close(v, mine) for v in values):
            wrong.append(f"{s.knob.name} ({s.knob.where} says {s.knob.raw}, the run printed "
                         f"{seen[0]})")
    if not wrong:
        return []
    return [Check("effective config", "warn",
                  f"the run printed other values than the editable files hold: {'; '.join(wrong)}",
                  "something later sets them (a config file, the command, the environment): "
                  "edit the place that wins, or mark the line `# knobs: skip`")]


def ignored_missing(target: Path, config: TargetConfig, error: str | None) -> str | None:
    """A missing file the run needed that the checkout has but git ignores: the assets fix."""
    m = _MISSING.search(error or "")
    if not m:
        return None
    rel = Path(config.workdir) / m.group(1)
    if not (target / rel).exists():
        return None
    ignored = subprocess.run(["git", "check-ignore", "-q", rel.as_posix()], cwd=target,
                             capture_output=True).returncode == 0
    if not ignored:
        return None
    parent = rel.parent.as_posix() if rel.parent.as_posix() != "." else rel.as_posix()
    return (f"{rel.as_posix()} is git-ignored, so a run's fresh worktree does not have it: add "
            f'it to assets in {CONFIG_FILE} (assets = ["{rel.as_posix()}"], or its folder '
            f'"{parent}" if everything in it is data)')


PROGRESS_LINE = "`step 120 | loss 3.41 | elapsed 31.2s`"


def _training_loops(files: dict[str, str]) -> Iterator[tuple[str, str, ast.For | ast.While]]:
    """(path, text, its training loop) for each Python file that parses and has one."""
    for path, text in files.items():
        try:
            loop = training_loop(ast.parse(text)) if path.endswith(".py") else None
        except SyntaxError:
            continue
        if loop is not None:
            yield path, text, loop


def _loop_at(files: dict[str, str]) -> str:
    """` in the training loop (path:line)`, from the first file that has one."""
    for path, _, loop in _training_loops(files):
        return f" in the training loop ({path}:{loop.lineno})"
    return ""


_EVAL_CALL = re.compile(r"eval|valid|estimate|(?:^|_)test", re.I)  # not latest()


def _evaluates(node: ast.If) -> bool:
    """Whether an `if`'s body calls something named like eval/valid/estimate/test."""
    return any(
        isinstance(c, ast.Call) and bool(_EVAL_CALL.search(
            getattr(c.func, "id", "") or getattr(c.func, "attr", "")))
        for b in node.body for c in ast.walk(b))


def _loop_evaluation(files: dict[str, str]) -> str | None:
    """`path:line` and the condition of an evaluation inside the training loop, else None."""
    for path, text, loop in _training_loops(files):
        node = next((n for n in ast.walk(loop) if isinstance(n, ast.If) and _evaluates(n)),
                    None)
        if node is not None:
            return f"{path}:{node.lineno} (`{text.splitlines()[node.lineno - 1].strip()}`)"
    return None


def timeout_fix(files: dict[str, str], log_lines: list[str]) -> str | None:
    """For a run killed at the timeout by a script that does read OVERNIGHT_BUDGET_S: where
    the time went instead (None: the generic fix, read the budget, is the right one)."""
    if not any("OVERNIGHT_BUDGET_S" in t for t in files.values()):
        return None
    printed = [line.strip() for line in log_lines if line.strip()]
    last = f"its last line was `{printed[-1][:120]}`" if printed else "it printed nothing"
    where = _loop_evaluation(files)
    inside = (f"; the training loop evaluates at {where}, which counts as training and may "
              "run from the first step" if where else "")
    return (f"the script reads OVERNIGHT_BUDGET_S, so the time went elsewhere: {last}{inside}. "
            "Make what runs besides training cheaper at this budget (fewer evaluation "
            "batches, no evaluation at step 0), or raise timeout_s")


def progress_fix(files: dict[str, str], lines: list[str]) -> str | None:
    """For a run none of whose lines gave a progress point: the progress_regex that reads the
    lines it printed, or what to print and where (None: nothing to add to the generic fix)."""
    fit = fit_progress(lines)
    if fit.regex:
        quote = "'''" if "'" in fit.regex else "'"
        return (f"set progress_regex = {quote}{fit.regex}{quote} in {CONFIG_FILE}: it reads "
                f"{fit.matched} of the {fit.lines} lines with a loss this run printed, e.g. "
                f"`{fit.example}`")
    if fit.default:
        return None
    where = _loop_at(files)
    if fit.lines:
        return (f"no regex reads the lines with a loss this run printed (e.g. `{fit.example}`): "
                "write progress_regex with the named groups `loss` and `step`, or print lines "
                f"such as {PROGRESS_LINE}{where}; the early stop of losing runs needs them")
    return (f"the run printed no line with a training loss: print one such as {PROGRESS_LINE}"
            f"{where}, at least every 5 % of the budget; the early stop of losing runs "
            '(prune = "auto") needs them')


# --- the doctor's runs and checks -------------------------------------------------------------
DOCTOR_BUDGET_S = 20.0


@dataclass(frozen=True)
class Diagnosis:
    checks: list[Check]
    runs: list[RunResult]
    logs: list[Path] = field(default_factory=list)  # kept run logs (with a work_dir)

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)


def facts_of(result: RunResult, progress_points: int, after_summary_s: float | None = None
             ) -> RunFacts:
    return RunFacts(timed_out=result.outcome is Outcome.TIMED_OUT, exit_code=result.exit_code,
                    wall_s=result.wall_s, summary=result.summary,
                    progress_points=progress_points, error=result.error,
                    after_summary_s=after_summary_s)


def _env(config: TargetConfig, seed: int) -> dict[str, str]:
    return {**config.budget_env(), "OVERNIGHT_SEED": str(seed),
            "OVERNIGHT_EXPERIMENT_ID": "doctor"}


def _run_once(config: TargetConfig, worktree: Path, log: Path, seed: int
              ) -> tuple[RunResult, ProgressMeter, Sample | None, float | None]:
    """One run: its result, its progress lines' meter, (with a metric) its sample, and the
    seconds from its summary block's `---` line to its exit (None: it printed none)."""
    pattern = re.compile(config.progress_regex) if config.progress_regex else None
    meter = ProgressMeter()
    summary_at: list[float] = []

    def on_line(line: str) -> None:
        if line.strip() == "---":
            summary_at.append(time.monotonic())
        point = parse_progress(line, pattern)
        if point is not None:
            meter.add(point.step if point.step >= 0 else meter.lines + 1, point.elapsed_s,
                      time.monotonic())

    argv = resolve_command(config.command) + extra_args(config, worktree)
    result = run_command(argv, cwd=worktree / config.workdir,
                         log_path=log, timeout_s=config.timeout_s, env=_env(config, seed),
                         grace_s=2.0, on_line=on_line)
    after = time.monotonic() - summary_at[-1] if summary_at and result.summary else None
    metric, found = _metric(result, config), speed(result.summary, meter)
    got = None if metric is None else Sample(metric, found.value, seed=seed, source=found.source)
    return result, meter, got, after


def target_files(repo: GitRepo, head: str, config: TargetConfig) -> dict[str, str]:
    """The editable files at HEAD, and the files the command names (config files), for the
    override chain."""
    named = [w for w in shlex.split(config.command) if w.endswith((".py", ".json", ".yaml",
                                                                     ".yml", ".toml"))]
    paths = list(dict.fromkeys([*config.editable, *named]))
    hashes = repo.file_hashes(head, paths)
    return {p: repo.read_file(head, p) for p in paths if hashes[p] != "missing"}


def static_checks(repo: GitRepo, config: TargetConfig) -> list[Check]:
    head = repo.head("HEAD")
    files = target_files(repo, head, config)
    editable = {p: t for p, t in files.items() if p in config.editable}
    dirty = dirty_files(repo, config)
    checks = [Check("checkout committed", "warn" if dirty else "ok",
                    f"uncommitted: {', '.join(dirty)}" if dirty else "nothing uncommitted",
                    "commit them: runs use committed files only" if dirty else "")]
    return [*checks, check_evaluation(config, editable), *knob_checks(config, files)]


def _first_run_checks(target: Path, config: TargetConfig, files: dict[str, str],
                      result: RunResult, meter: ProgressMeter, log: Path,
                      imports: ImportFacts | None, after_summary_s: float | None = None
                      ) -> list[Check]:
    """check_run and the early stop's check, with the fix for what the log shows (a missing
    git-ignored file, the repository's own package not found, progress lines no regex reads:
    the regex that reads them, which also turns the early stop on), and printed values."""
    checks = check_run(config, facts_of(result, meter.lines, after_summary_s))
    hint = ignored_missing(target, config, result.error) or missing_own_package(
        imports, result.error) or missing_dependency(config, result.error, target)
    if hint:
        checks = [replace(c, fix=hint) if c.name == "runs" else c for c in checks]
    text = log.read_text(errors="replace") if log.is_file() else ""
    late = timeout_fix(files, text.splitlines()) if result.outcome is Outcome.TIMED_OUT else None
    if late:
        checks = [replace(c, fix=late) if c.name == "budget honoured" else c for c in checks]
    states = knob_states(config, files)
    early = short_run(config.budget_s, files, result.summary, states) if config.time_budget \
        else None
    if early:
        checks = [replace(c, detail=early[0], fix=early[1]) if c.name == "budget honoured" else c
                  for c in checks]
    timed = meter.last_timed
    stop = check_early_stop(config, meter.lines, timed.elapsed_s if timed is not None else None)
    failed = any(c.name == "runs" and c.status == "fail" for c in checks)
    progress = progress_fix(files, text.splitlines()) if meter.lines == 0 and not failed \
        else None
    if progress:
        checks = [replace(c, fix=progress) if c.name == "progress lines" else c for c in checks]
        stop = replace(stop, detail=f"{stop.detail}; to turn it on: {progress}", fix=progress)
    return [*checks, *printed_values(states, text), stop]


def _work_root(work_dir: Path | None, stack: ExitStack) -> Path:
    if work_dir is None:
        return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="overnight-doctor-")))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = Path(work_dir) / "doctor" / f"{stamp}-{os.getpid()}"
    root.mkdir(parents=True, exist_ok=True)
    return root


def diagnose(target: Path, config: TargetConfig, runs: int = 2,
             work_dir: Path | None = None) -> Diagnosis:
    """Static checks, then `runs` runs of HEAD (stopping after a first run that failed).

    With `work_dir` (the database's, from --db), the run logs are kept under
    `<work_dir>/doctor/`; otherwise everything goes in a temporary folder."""
    repo = GitRepo(target)
    checks = static_checks(repo, config)
    head = repo.head("HEAD")
    files = target_files(repo, head, config)
    asset_hashes(repo, target, head, config)  # a missing asset: ConfigError now
    results: list[RunResult] = []
    with ExitStack() as stack:
        tmp = _work_root(work_dir, stack)
        worktree = tmp / "wt"
        repo.add_worktree(worktree, head)
        try:
            link_assets(worktree, target, config)
            imports = import_facts(resolve_command(config.command), worktree / config.workdir,
                                   worktree, _env(config, config.seed), config.command)
            first, meter, one, after = _run_once(config, worktree, tmp / "run1.log",
                                                 config.seed)
            results.append(first)
            checks += _import_checks(imports, config, first)
            checks += _first_run_checks(target, config, files, first, meter,
                                        tmp / "run1.log", imports, after)
            if runs > 1 and not any(c.status == "fail" for c in checks):
                second, _, two, _ = _run_once(config, worktree, tmp / "run2.log",
                                              config.seed + 1)
                results.append(second)
                checks += _second_run_checks(config, second, [one, two])
            elif one is not None:
                checks.append(check_speed([one]))
        finally:
            repo.remove_worktree(worktree)
    logs = [tmp / f"run{i + 1}.log" for i in range(len(results))] if work_dir else []
    return Diagnosis(checks, results, logs)


def _import_checks(imports: ImportFacts | None, config: TargetConfig,
                   first: RunResult) -> list[Check]:
    """Where the run imports the repository's packages from (a run that already failed for
    want of one says so itself, with the same fix)."""
    found = check_imports(imports, list(config.editable))
    if found is None or (found.status == "fail" and missing_own_package(imports, first.error)):
        return []
    return [found]


def _second_run_checks(config: TargetConfig, second: RunResult,
                       samples: list[Sample | None]) -> list[Check]:
    """Seeds seed and seed + 1: is the seed used, the seed-to-seed noise, the load check."""
    metrics = [s.metric if s is not None else None for s in samples]
    pair = [s for s in samples if s is not None]
    if metrics[1] is None:
        why = "timed out" if second.outcome is Outcome.TIMED_OUT else (
            second.error or f"exit code {second.exit_code}")
        return [Check("noise", "warn", f"the second run printed no {config.metric} ({why}) "
                      "although the first did", "a run that fails only sometimes: read its log")]
    return [check_seed(pair, config.metric), *check_noise(config, metrics[0], metrics[1]),
            check_speed(pair)]


def _metric(result: RunResult, config: TargetConfig) -> float | None:
    value = result.summary.get(config.metric)
    return float(value) if isinstance(value, int | float) else None
