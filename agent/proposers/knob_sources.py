"""Knob discovery: the hyper-parameters of editable files, wherever they live.

Python files: agent.proposers.knob_python (config-block globals of any case, UPPER_CASE
constants, argparse, typer, click, fire and jsonargparse defaults, dataclass fields). Config
files: numeric/boolean keys of YAML (named by their nested path, `model.optimizer.lr`), TOML
(`section.key`) and JSON. A target's
`args_file` (command-line arguments, one or more a line): `--lr=0.1`, `--lr 0.1`, hydra's
`model.lr=0.1`. Each Knob knows the column of its literal, so `Knob.rewrite` changes exactly
that literal in its line. Pure: the stdlib and agent.core.diff.
A line that carries the comment `knobs: skip` is left alone.
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath

from agent.core.diff import split_lines
from agent.proposers.knob_base import SKIP, Knob, Value, find_constants
from agent.proposers.knob_python import python_knobs
from agent.rules.knob_space import parse_literal

__all__ = ["SKIP", "Knob", "Value", "find_constants", "find_knobs"]

_NUMBER = r"[-+]?(?:\d[\d_]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"
_CONFIG_LINE = {  # key, then the literal; a trailing comment is allowed
    "yaml": re.compile(rf"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w.-]*)\s*:\s*"
                       rf"(?P<value>true|false|True|False|{_NUMBER})\s*(?:#.*)?$"),
    "toml": re.compile(rf"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w-]*)\s*=\s*"
                       rf"(?P<value>true|false|{_NUMBER})\s*(?:#.*)?$"),
    "json": re.compile(rf"^(?P<indent>\s*)\"(?P<key>[^\"]+)\"\s*:\s*"
                       rf"(?P<value>true|false|{_NUMBER})\s*,?\s*$"),
}
_YAML_OPEN = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w.-]*)\s*:\s*(?:#.*)?$")
_CONFIG_SUFFIX = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}
_QUOTED_FLAG = re.compile(r"""["'](--[A-Za-z][\w-]*)["']""")
_ARG = re.compile(rf"(?:^|\s)(?P<key>(?:--?|\+{{0,2}})[A-Za-z_][\w.-]*)(?:=|\s+)"
                  rf"(?P<value>true|false|True|False|{_NUMBER})(?=\s|$)")


def _yaml_scope(stack: list[tuple[int, str]], indent: int) -> str:
    while stack and stack[-1][0] >= indent:
        stack.pop()
    return "".join(f"{key}." for _, key in stack)


def find_config_knobs(path: str, text: str, kind: str) -> list[Knob]:
    """Numeric and boolean keys of a YAML/TOML/JSON file, one `key: value` per line."""
    pattern, section, knobs = _CONFIG_LINE[kind], "", []
    stack: list[tuple[int, str]] = []  # YAML: the open mappings above this line
    for i, line in enumerate(split_lines(text)):
        if kind == "yaml" and line.strip() and not line.lstrip().startswith(("#", "-")):
            indent = len(line) - len(line.lstrip())
            section = _yaml_scope(stack, indent)
            opened = _YAML_OPEN.match(line)
            if opened:
                stack.append((indent, opened.group("key")))
                continue
        header = re.match(r"^\s*\[([^\]]+)\]\s*$", line) if kind == "toml" else None
        if header:
            section = header.group(1) + "."
        m = pattern.match(line)
        if not m or SKIP in line:
            continue
        raw = m.group("value")
        knobs.append(Knob(path, i, section + m.group("key"), raw, parse_literal(raw), kind=kind,
                          col=m.start("value")))
    return knobs


def find_args_knobs(path: str, text: str) -> list[Knob]:
    """`--key=value`, `--key value` and `key=value` arguments with a numeric/boolean value."""
    knobs = []
    for i, line in enumerate(split_lines(text)):
        code = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        if SKIP in line:
            continue
        for m in _ARG.finditer(code):
            raw = m.group("value")
            knobs.append(Knob(path, i, m.group("key"), raw, parse_literal(raw), kind="args",
                              col=m.start("value")))
    return knobs


def find_knobs(path: str, text: str, args_file: str | None = None) -> list[Knob]:
    """Every knob of one editable file, in file order, one per (line, name)."""
    if args_file is not None and path == args_file:
        return find_args_knobs(path, text)
    kind = _CONFIG_SUFFIX.get(PurePosixPath(path).suffix.lower())
    if kind is not None:
        return find_config_knobs(path, text, kind)
    if not path.endswith(".py"):
        return []
    return python_knobs(path, text)[0]


def no_knobs_message(files: dict[str, str], dead: list[str] | None = None) -> str:
    """Why a knobs sweep has nothing to change; `dead`: the knobs found but overridden."""
    names = ", ".join(sorted(files)) or "the editable files"
    if dead:
        return (f"no live knobs in {names}: {len(dead)} found, each set again later "
                f"(e.g. {dead[0]}); `overnight doctor` lists where each one is set. Edit the "
                "place that wins (a config file the command names, or an args_file for the "
                "command's flags), or use --proposer llm:<profile> or queue")
    return (f"no knobs found in {names}: the knobs proposer changes literals of a script's "
            "config block (module globals before the first statement that does something), "
            "UPPER_CASE constants, the defaults of argparse, typer, click, fire and jsonargparse "
            "options, dataclass field defaults, numeric keys of YAML/TOML/JSON files"
            " listed in `editable` and the lines of `args_file`; see "
            "docs/adopt.md 'Knobs'. Add one of those, or use --proposer llm:<profile> or queue")


def how_to_give_knobs(script: str, text: str, command: str, adopted: str | None = None) -> str:
    """One sentence: how to give a script with no searchable knob some (`text`: the script's,
    whose quoted `--flags` make the example; `adopted`: the repository adopt is adopting, to
    say it again with the flags; None: a target's overnight.toml exists)."""
    flags = [f for f in dict.fromkeys(_QUOTED_FLAG.findall(text)) if f != "--help"][:3]
    example = " ".join(f"{f} <value>" for f in flags) or "--lr 0.001"
    if adopted is not None:
        where = (f"in adopt's command (`overnight adopt {shlex.quote(adopted)} --force --command "
                 f"{shlex.quote(f'{command} {example}')}` writes them into overnight.args, "
                 "for a sweep to change)")
    else:
        where = (f"in an args_file (`{example}` in overnight.args, with args_file = "
                 "\"overnight.args\" in overnight.toml and in editable)")
    return (f"give {script} the hyper-parameters to search as flags {where}, or as constants "
            "at its top (`LR = 0.001`)")
