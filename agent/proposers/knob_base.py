"""The Knob: one hyper-parameter literal in a file, and how to rewrite it in place.

Also module-level UPPER_CASE constants found line by line (the reference target's style; works
on a file that does not parse), and a Knob made from a literal node of a parsed file (the
Python finders'). Pure: the stdlib and agent.core.diff.
A line that carries the comment `knobs: skip` is left alone.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from agent.core.diff import split_lines
from agent.rules.knob_space import parse_literal

Value = float | int | bool | str

_CONST = re.compile(
    r"^(?P<name>[A-Z][A-Z0-9_]*)(?P<sep>\s*(?::\s*\w+\s*)?=\s*)"
    r"(?P<value>True|False|[-+]?(?:\d[\d_]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?))"
    r"(?P<rest>\s*(?:#.*)?)$"
)
SKIP = "knobs: skip"


@dataclass(frozen=True)
class Knob:
    """One hyper-parameter: where its literal is (line, column) and its current value."""

    path: str
    line_no: int
    name: str
    raw: str
    value: Value
    # constant (UPPER) | global (a config-block global) | argparse | typer | click | fire |
    # jsonargparse | dataclass | yaml | toml | json | args (a line of the target's args_file)
    kind: str = "constant"
    col: int = -1  # column of `raw` in the line; -1: its first occurrence
    choices: tuple[str, ...] = ()  # literals it may take (argparse choices), as source text
    flag: str = ""  # a CLI option's long flag, e.g. "--lr" (argparse, typer, click, ...)
    flags: tuple[str, ...] = ()  # every flag that sets it ("-l", "--lr")

    @property
    def key(self) -> str:
        """The name a command line sets it by: `lr` for `Cfg.lr`, `--lr` or `model.lr`."""
        return self.name.split(".", 1)[1] if self.kind == "dataclass" else self.name

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line_no + 1}"

    def rewrite(self, line: str, literal: str) -> str:
        """The line with this knob's literal replaced; Python booleans follow the file's style."""
        if self.kind in ("yaml", "toml", "json", "args") and literal in ("True", "False"):
            literal = literal.lower()
        start = self.col if self.col >= 0 else line.find(self.raw)
        if start < 0 or line[start:start + len(self.raw)] != self.raw:
            raise ValueError(f"{self.path}:{self.line_no + 1}: {self.raw!r} is no longer there")
        return line[:start] + literal + line[start + len(self.raw):]


def find_constants(path: str, text: str) -> list[Knob]:
    """Module-level `UPPER = literal` lines (the reference target's style)."""
    knobs = []
    for i, line in enumerate(split_lines(text)):
        m = _CONST.match(line)
        if not m or SKIP in m.group("rest"):
            continue
        raw = m.group("value")
        knobs.append(Knob(path, i, m.group("name"), raw, parse_literal(raw), col=m.start("value")))
    return knobs


def literal_value(node: ast.expr | None) -> Value | None:
    """The value of a literal node (a number, a boolean, a string, a negated number); else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = literal_value(node.operand)
        return -inner if isinstance(inner, int | float) and not isinstance(inner, bool) else None
    if isinstance(node, ast.Constant) and isinstance(node.value, bool | int | float | str):
        return node.value
    return None


def knob_at(path: str, lines: list[str], node: ast.expr, name: str, kind: str,
            **extra: object) -> Knob | None:
    """A Knob for a literal node on one line (columns converted from UTF-8 bytes)."""
    value = literal_value(node)
    if value is None or node.end_lineno != node.lineno or node.end_col_offset is None:
        return None
    line = lines[node.lineno - 1]
    if SKIP in line:
        return None
    encoded = line.encode()
    col = len(encoded[: node.col_offset].decode(errors="replace"))
    raw = encoded[node.col_offset: node.end_col_offset].decode(errors="replace")
    if isinstance(value, str) and not extra.get("choices"):
        return None  # free text has no neighbours to try
    return Knob(path, node.lineno - 1, name, raw, value, kind=kind, col=col, **extra)  # type: ignore[arg-type]
