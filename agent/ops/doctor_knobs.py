"""doctor's knob checks: every knob, where it is set and whether a change to it reaches the run.

Static, from the override chain (agent.proposers.knob_chain): each knob with its file and line,
searched / bookkeeping / dead (and what wins); the command's flags that override editable
values, in every config style. Cheap and dynamic, from the first run's log: a searched knob
whose name the run printed only with another value (the effective config a script prints:
nanoGPT's `Overriding: lr = ...`, `print(vars(args))`, Trainer's arguments, hydra's tree) is
overridden somewhere the chain cannot see. A run that failed on a missing file that is
git-ignored in the checkout: it belongs in `assets`. And progress lines no regex reads: the
progress_regex that fits the lines the run printed (agent.ops.adopt_progress), or what to print
and where (the training loop's file and line). Pure except `ignored_missing` (git).
"""

from __future__ import annotations

import ast
import math
import re
import subprocess
from pathlib import Path

from agent.core.config import CONFIG_FILE, TargetConfig
from agent.ops.adopt_contract import training_loop
from agent.ops.adopt_progress import fit_progress
from agent.proposers.knob_chain import KnobState, flag_key, resolve
from agent.rules.contract import Check

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
                    "" if searched else "nothing for the knobs proposer to change: see the dead "
                    "knobs below for what wins, or use --proposer llm:<profile>")
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


def _loop_at(files: dict[str, str]) -> str:
    """` in the training loop (path:line)`, from the first file that has one."""
    for path, text in files.items():
        try:
            loop = training_loop(ast.parse(text)) if path.endswith(".py") else None
        except SyntaxError:
            continue
        if loop is not None:
            return f" in the training loop ({path}:{loop.lineno})"
    return ""


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
