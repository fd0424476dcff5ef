"""The command a user really runs, and the files it makes part of the target: pure text rules.

The README's own `python <script> ...` lines are the best guess of how a script is run (on a
machine without a GPU, a line that mentions `cpu` first). The words after the script split in
two: the files it names (a Python config file exec'd over the globals, a JSON file of
arguments, which stay in `command`) and the flags (which go to the `args_file`, one a line, so
that a sweep can search them; bookkeeping ones are marked `knobs: skip`). Hydra scripts: the
config files their defaults list selects.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from pathlib import Path

from agent.proposers.knob_chain import PLUMBING, flag_key, script_word, takes_value

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
