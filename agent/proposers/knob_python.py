"""Knobs of Python sources, and the static facts that decide whether a change to one can count.

Finds the literals of a script's config block (module-level `name = <literal>` of any case
before the first top-level statement that does something, so `exec(open('configurator.py')
.read())` or `if ddp:` ends it; UPPER_CASE constants count anywhere at module level),
argparse `add_argument(..., default=<literal>)`, the options of typer, click, fire and
jsonargparse (agent.proposers.knob_cli), dataclass fields (`x: int = 3` and
`x: int = field(default=3)`) and attribute-style config keys (`C.model.n_layer = 6`, found by
agent.proposers.knob_attrs). Alongside, per file: module globals assigned again later, CLI
options their function sets again, the calls that construct each dataclass (with the fields
they pass explicitly), the dataclasses parsed from the command line (HfArgumentParser, tyro,
simple_parsing, jsonargparse, fire) and whether the file exec()s code over its globals. Pure:
the stdlib, agent.core.diff and the knob modules.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from agent.core.diff import split_lines
from agent.proposers.knob_attrs import AttrFacts, attr_facts, attr_knobs
from agent.proposers.knob_base import Knob, find_constants, knob_at, literal_value
from agent.proposers.knob_cli import cli_knobs

ALL = frozenset({"*"})  # a construction whose keyword set is unknown (`Cls(**kwargs)`)
CLI_PARSERS = ("HfArgumentParser", "cli", "parse", "add_arguments", "ArgumentParser", "CLI",
               "auto_cli", "Fire", "add_class_arguments")


@dataclass
class PythonFacts:
    """What one file says about the liveness of knobs (merged across files by knob_chain)."""

    reassigned: dict[str, int] = field(default_factory=dict)  # global -> line it is set again
    set_again: dict[tuple[int, int], int] = field(default_factory=dict)  # CLI option -> line
    constructions: dict[str, list[frozenset[str]]] = field(default_factory=dict)
    fields: dict[str, list[str]] = field(default_factory=dict)  # dataclass -> field order
    parsed_from_cli: set[str] = field(default_factory=set)  # dataclasses parsed from argv
    execs_over_globals: bool = False  # exec(open(...).read()) at module level (configurator)
    attrs: AttrFacts = field(default_factory=AttrFacts)  # attribute-style configs


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
        values = [literal_value(e) for e in options.elts]
        choices = tuple(f"{quote}{v}{quote}" if isinstance(v, str) else repr(v)
                        for v in values if v is not None)
    return knob_at(path, lines, keywords["default"], name, "argparse", choices=choices,
                    flag=long, flags=tuple(flags))


def _is_dataclass(node: ast.ClassDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if (isinstance(target, ast.Name) and target.id == "dataclass") or (
                isinstance(target, ast.Attribute) and target.attr == "dataclass"):
            return True
    return False


def _field_default(value: ast.expr) -> ast.expr:
    """`field(default=3, ...)` -> the `3` node; anything else is its own default."""
    if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name | ast.Attribute)
            and (getattr(value.func, "id", None) or getattr(value.func, "attr", None)) == "field"):
        return next((k.value for k in value.keywords if k.arg == "default"), value)
    return value


def _dataclass_knobs(path: str, lines: list[str], node: ast.ClassDef,
                     facts: PythonFacts) -> list[Knob | None]:
    knobs: list[Knob | None] = []
    order = facts.fields.setdefault(node.name, [])
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            order.append(item.target.id)
            if item.value is not None:
                knobs.append(knob_at(path, lines, _field_default(item.value),
                                      f"{node.name}.{item.target.id}", "dataclass"))
    return knobs


def _is_action(stmt: ast.stmt) -> bool:
    """A top-level statement that does something: it ends the script's config block."""
    if isinstance(stmt, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.AsyncFunctionDef
                  | ast.ClassDef | ast.Assign | ast.AnnAssign):
        return False
    return not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))


def _config_block(path: str, lines: list[str], tree: ast.Module) -> list[Knob | None]:
    """Literal module globals of any case before the first top-level action."""
    knobs: list[Knob | None] = []
    for stmt in tree.body:
        if _is_action(stmt):
            break
        if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
            continue
        target = stmt.targets[0]
        if isinstance(target, ast.Name) and not target.id.startswith("_"):
            knobs.append(knob_at(path, lines, stmt.value, target.id, "global"))
    return knobs


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _reassigned(tree: ast.Module) -> dict[str, int]:
    """Module globals set unconditionally again later, by a value that does not read them."""
    first: dict[str, int] = {}
    again: dict[str, int] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(
                stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            if name in first and name not in again and name not in _names_in(stmt.value):
                again[name] = stmt.lineno - 1
            first.setdefault(name, stmt.lineno - 1)
    return again


def _keys_of(scope: list[ast.stmt], name: str) -> frozenset[str] | None:
    """The keys a dict-valued local gets in a body: `name = dict(a=..)` or `{'a': ..}`, then
    `name['b'] = ...`; None when its value is anything else (unknown keys)."""
    keys: set[str] = set()
    found = False
    for node in (n for stmt in scope for n in ast.walk(stmt)):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Name) and target.id == name:
                if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "dict" \
                        and not value.args:
                    keys |= {k.arg for k in value.keywords if k.arg}
                    found = found or all(k.arg for k in value.keywords)
                elif isinstance(value, ast.Dict) and all(
                        isinstance(k, ast.Constant) and isinstance(k.value, str)
                        for k in value.keys):
                    keys |= {str(k.value) for k in value.keys if isinstance(k, ast.Constant)}
                    found = True
                else:
                    return None
            elif (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                  and target.value.id == name and isinstance(target.slice, ast.Constant)):
                keys.add(str(target.slice.value))
    return frozenset(keys) if found else None


def _constructions(tree: ast.Module, classes: set[str], facts: PythonFacts) -> None:
    scopes: list[list[ast.stmt]] = [
        n.body for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    seen: set[int] = set()  # a call is judged in its innermost function (or the module)
    for scope in [*reversed(scopes), tree.body]:
        for node in (n for stmt in scope for n in ast.walk(stmt)):
            if not isinstance(node, ast.Call) or id(node) in seen:
                continue
            seen.add(id(node))
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in CLI_PARSERS:
                facts.parsed_from_cli |= {n.id for n in ast.walk(node)
                                          if isinstance(n, ast.Name) and n.id != name}
            if name not in classes:
                continue
            passed: set[str] = {k.arg for k in node.keywords if k.arg}
            for k in node.keywords:
                if k.arg is None:
                    keys = _keys_of(scope, k.value.id) if isinstance(k.value, ast.Name) else None
                    passed |= ALL if keys is None else keys
            facts.constructions.setdefault(name, []).append(
                frozenset(passed | {f"#{i}" for i in range(len(node.args))}))


def python_knobs(path: str, text: str, classes: set[str] | None = None,
                 known: frozenset[str] = frozenset(), getters: frozenset[str] = frozenset()
                 ) -> tuple[list[Knob], PythonFacts]:
    """Every knob of one Python file and its facts; an unparsable file: constants only.

    `classes` names the dataclasses (of any file) whose constructions to record; `known` and
    `getters` the functions (of any file) that set config keys and that return a config.
    """
    facts = PythonFacts()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return find_constants(path, text), facts
    lines = split_lines(text)
    found: list[Knob | None] = [*find_constants(path, text), *_config_block(path, lines, tree)]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            found.append(_argparse_knob(path, lines, node))
        elif isinstance(node, ast.ClassDef) and _is_dataclass(node):
            found += _dataclass_knobs(path, lines, node, facts)
    options = cli_knobs(path, lines, tree)
    found += options.knobs
    facts.set_again = options.set_again
    facts.attrs = attr_facts(path, text, tree, known, getters)
    found += attr_knobs(facts.attrs)
    facts.reassigned = _reassigned(tree)
    facts.execs_over_globals = any(
        isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
        and getattr(s.value.func, "id", "") == "exec" for s in tree.body)
    _constructions(tree, set(facts.fields) | (classes or set()), facts)
    unique: dict[tuple[int, int], Knob] = {}
    for knob in found:  # the first finder of a literal names its kind (constant before global)
        if knob is not None:
            unique.setdefault((knob.line_no, knob.col), knob)
    return sorted(unique.values(), key=lambda k: (k.line_no, k.col)), facts
