"""Knob discovery: the hyper-parameters of editable files, wherever they live.

Finds module-level UPPER_CASE constants, argparse `add_argument(..., default=<literal>)` (with
`type` and `choices`), dataclass fields with literal defaults, and numeric/boolean keys of YAML,
TOML and JSON files. Each Knob knows the column of its literal, so `Knob.rewrite` changes
exactly that literal in its line (the proposer builds the diff from it). Pure: the stdlib and
agent.core.diff (lines split as git splits them, as the proposer does).
A line that carries the comment `knobs: skip` is left alone.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from agent.core.diff import split_lines

Value = float | int | bool | str

_CONST = re.compile(
    r"^(?P<name>[A-Z][A-Z0-9_]*)(?P<sep>\s*(?::\s*\w+\s*)?=\s*)"
    r"(?P<value>True|False|[-+]?(?:\d[\d_]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?))"
    r"(?P<rest>\s*(?:#.*)?)$"
)
_NUMBER = r"[-+]?(?:\d[\d_]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"
_CONFIG_LINE = {  # key, then the literal; a trailing comment is allowed
    "yaml": re.compile(rf"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w.-]*)\s*:\s*"
                       rf"(?P<value>true|false|{_NUMBER})\s*(?:#.*)?$"),
    "toml": re.compile(rf"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w-]*)\s*=\s*"
                       rf"(?P<value>true|false|{_NUMBER})\s*(?:#.*)?$"),
    "json": re.compile(rf"^(?P<indent>\s*)\"(?P<key>[^\"]+)\"\s*:\s*"
                       rf"(?P<value>true|false|{_NUMBER})\s*,?\s*$"),
}
_CONFIG_SUFFIX = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}
SKIP = "knobs: skip"


@dataclass(frozen=True)
class Knob:
    """One hyper-parameter: where its literal is (line, column) and its current value."""

    path: str
    line_no: int
    name: str
    raw: str
    value: Value
    kind: str = "constant"  # constant | argparse | dataclass | yaml | toml | json
    col: int = -1  # column of `raw` in the line; -1: its first occurrence
    choices: tuple[str, ...] = ()  # literals it may take (argparse choices), as source text
    flag: str = ""  # the argparse option string, e.g. "--lr"

    def rewrite(self, line: str, literal: str) -> str:
        """The line with this knob's literal replaced; Python booleans follow the file's style."""
        if self.kind in ("yaml", "toml", "json") and literal in ("True", "False"):
            literal = literal.lower()
        start = self.col if self.col >= 0 else line.find(self.raw)
        if start < 0 or line[start:start + len(self.raw)] != self.raw:
            raise ValueError(f"{self.path}:{self.line_no + 1}: {self.raw!r} is no longer there")
        return line[:start] + literal + line[start + len(self.raw):]


def parse_literal(raw: str) -> Value:
    if raw in ("True", "true"):
        return True
    if raw in ("False", "false"):
        return False
    if re.fullmatch(r"[-+]?\d[\d_]*", raw):
        return int(raw.replace("_", ""))
    return float(raw)


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


def _literal(node: ast.expr | None) -> Value | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _literal(node.operand)
        return -inner if isinstance(inner, int | float) and not isinstance(inner, bool) else None
    if isinstance(node, ast.Constant) and isinstance(node.value, bool | int | float | str):
        return node.value
    return None


def _located(path: str, lines: list[str], node: ast.expr, name: str, kind: str,
             **extra: object) -> Knob | None:
    """A Knob for a literal node on one line (columns converted from UTF-8 bytes)."""
    value = _literal(node)
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


def _argparse_knob(path: str, lines: list[str], call: ast.Call) -> Knob | None:
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    if not flags or "default" not in keywords:
        return None
    long = next((f for f in flags if f.startswith("--")), flags[0])
    dest = keywords.get("dest")
    name = (dest.value if isinstance(dest, ast.Constant) and isinstance(dest.value, str)
            else long.lstrip("-").replace("-", "_"))
    choices: tuple[str, ...] = ()
    options = keywords.get("choices")
    if isinstance(options, ast.List | ast.Tuple):
        raw = ast.get_source_segment("\n".join(lines), keywords["default"]) or ""
        quote = raw[0] if raw[:1] in ("'", '"') else "'"
        values = [_literal(e) for e in options.elts]
        choices = tuple(f"{quote}{v}{quote}" if isinstance(v, str) else repr(v)
                        for v in values if v is not None)
    return _located(path, lines, keywords["default"], name, "argparse", choices=choices,
                    flag=long)


def _is_dataclass(node: ast.ClassDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if (isinstance(target, ast.Name) and target.id == "dataclass") or (
                isinstance(target, ast.Attribute) and target.attr == "dataclass"):
            return True
    return False


def find_python_knobs(path: str, text: str) -> list[Knob]:
    """argparse defaults and dataclass field defaults (an unparsable file has none)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines = split_lines(text)
    knobs: list[Knob | None] = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            knobs.append(_argparse_knob(path, lines, node))
        elif isinstance(node, ast.ClassDef) and _is_dataclass(node):
            for item in node.body:
                if (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                        and item.value is not None):
                    name = f"{node.name}.{item.target.id}"
                    knobs.append(_located(path, lines, item.value, name, "dataclass"))
    return [k for k in knobs if k is not None]


def find_config_knobs(path: str, text: str, kind: str) -> list[Knob]:
    """Numeric and boolean keys of a YAML/TOML/JSON file, one `key: value` per line."""
    pattern, section, knobs = _CONFIG_LINE[kind], "", []
    for i, line in enumerate(split_lines(text)):
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


def find_knobs(path: str, text: str) -> list[Knob]:
    """Every knob of one editable file, in file order, one per (line, name)."""
    kind = _CONFIG_SUFFIX.get(PurePosixPath(path).suffix.lower())
    if kind is not None:
        return find_config_knobs(path, text, kind)
    if not path.endswith(".py"):
        return []
    found = {(k.line_no, k.name): k for k in find_constants(path, text)}
    for knob in find_python_knobs(path, text):
        found.setdefault((knob.line_no, knob.name), knob)
    return sorted(found.values(), key=lambda k: (k.line_no, k.col))


def no_knobs_message(files: dict[str, str]) -> str:
    names = ", ".join(sorted(files)) or "the editable files"
    return (f"no knobs found in {names}: the knobs proposer changes module-level UPPER_CASE "
            "constants, argparse defaults (add_argument(..., default=<number>)), dataclass field "
            "defaults and numeric keys of YAML/TOML/JSON files listed in `editable`; "
            "see docs/target.md 'Knobs'. Add one of those, or use --proposer llm:<profile> or "
            "queue")
