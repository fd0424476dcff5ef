"""Knobs of command-line interfaces made from functions: typer, click, fire and jsonargparse.

Read from the source (none of these libraries is imported); each option with a literal
default is a Knob of that library's kind, with the flags that set it, named as the library
names them:

- typer, in a file that imports it: the parameters with a default of a command
  (`@app.command()`, `@app.callback()`, a function given to `typer.run`): `lr: float = 0.1`,
  `lr: float = typer.Option(0.1, "--learning-rate", "-l")`, `lr: Annotated[float,
  typer.Option(help=...)] = 0.1`. The flag is the parameter's name with `_` -> `-`
  (`weight_decay` -> `--weight-decay`), a boolean also `--no-…`; `typer.Argument`s are
  positional, not flags.
- click: `@click.option("--lr", default=0.1)` (`is_flag`, `--x/--no-x` and
  `type=click.Choice([...])` included); its name is the explicit one, else the first long
  flag with `-` -> `_`.
- fire: `fire.Fire(fn)`, `fire.Fire(Class)` (its `__init__`), `fire.Fire({"name": fn})`: the
  parameters with a default, as `--name` (fire takes `--weight_decay` and `--weight-decay`).
- jsonargparse, in a file that imports it: `CLI(...)` and `auto_cli(...)` like fire (a
  function, a class, a list or dict of them), a parser's `add_function_arguments(fn)` and
  `add_class_arguments(Class, "key")` (`--key.lr`); its `add_argument` is argparse's reader's.

A parameter the function's body assigns again at its top level, with a value that does not
read it, is dead: `set_again` maps the knob's (line, column) to that line. Pure: the stdlib
and knob_base.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

from agent.proposers.knob_base import Knob, knob_at, literal_value

CLI_KINDS = ("typer", "click", "fire", "jsonargparse")
Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class CliKnobs:
    """The options one file declares, and those its functions overwrite before use."""

    knobs: list[Knob] = field(default_factory=list)
    set_again: dict[tuple[int, int], int] = field(default_factory=dict)  # (line, col) -> line


def _callee(node: ast.AST) -> str:
    """`typer.Option` -> `Option`, `Option` -> `Option`; anything else -> ``."""
    if isinstance(node, ast.Call):
        node = node.func
    return getattr(node, "attr", None) or getattr(node, "id", None) or ""


def _strings(args: list[ast.expr]) -> list[str]:
    return [a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)]


def _imports(tree: ast.Module) -> set[str]:
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    return names | {(n.module or "").split(".")[0] for n in ast.walk(tree)
                    if isinstance(n, ast.ImportFrom)}


def _params(fn: Function) -> Iterator[tuple[ast.arg, ast.expr]]:
    """(parameter, its default) for each parameter with one, `self`/`cls` left out."""
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults, strict=True))
    pairs += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
    yield from ((p, d) for p, d in pairs if p.arg not in ("self", "cls"))


def _set_again(fn: Function, name: str) -> int | None:
    """0-based line where the body's top level sets `name` again from a value not reading it."""
    for stmt in fn.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
            else stmt.target if isinstance(stmt, ast.AnnAssign) and stmt.value else None
        value = getattr(stmt, "value", None)
        if isinstance(target, ast.Name) and target.id == name and value is not None and name \
                not in {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}:
            return stmt.lineno - 1
    return None


@dataclass
class _Reader:
    path: str
    lines: list[str]
    found: CliKnobs = field(default_factory=CliKnobs)

    def add(self, fn: Function, node: ast.expr, name: str, kind: str, flags: list[str],
            choices: tuple[str, ...] = ()) -> None:
        knob = knob_at(self.path, self.lines, node, name, kind, choices=choices,
                       flag=next((f for f in flags if f.startswith("--")), flags[0]),
                       flags=tuple(flags))
        if knob is None:
            return
        self.found.knobs.append(knob)
        again = _set_again(fn, name)
        if again is not None:
            self.found.set_again[(knob.line_no, knob.col)] = again

    def signature(self, fn: Function, kind: str, prefix: str = "") -> None:
        """fire's and jsonargparse's options: every parameter with a literal default."""
        for param, default in _params(fn):
            key = prefix + param.arg
            dashed = key.replace("_", "-")
            self.add(fn, default, key, kind, [f"--{key}", *([f"--{dashed}"] if
                                                          kind == "fire" and dashed != key
                                                          else [])])

    def typer_command(self, fn: Function) -> None:
        for param, default in _params(fn):
            option = _annotated_option(param.annotation)
            if isinstance(default, ast.Call) and _callee(default) in ("Option", "Argument"):
                option, decls = default, default.args[1:]
                default = default.args[0] if default.args else next(
                    (k.value for k in default.keywords if k.arg == "default"), default)
            else:
                decls = option.args if option is not None else []
            if option is not None and _callee(option) == "Argument":
                continue
            flags = [f for d in _strings(decls) for f in d.split("/") if f.startswith("-")]
            if not flags:
                flags = [f"--{param.arg.replace('_', '-')}"]
                if isinstance(literal_value(default), bool):
                    flags.append(f"--no-{param.arg.replace('_', '-')}")
            self.add(fn, default, param.arg, "typer", flags)

    def click_option(self, fn: Function, call: ast.Call) -> None:
        decls = _strings(call.args)
        flags = [f for d in decls for f in d.split("/") if f.startswith("-")]
        keywords = {k.arg: k.value for k in call.keywords if k.arg}
        if not flags or "default" not in keywords:
            return
        named = [d for d in decls if not d.startswith("-")]
        long = next((f for f in flags if f.startswith("--")), flags[0])
        name = named[0] if named else long.lstrip("-").replace("-", "_").lower()
        choice = keywords.get("type")
        options = choice.args[0] if isinstance(choice, ast.Call) and _callee(choice) == \
            "Choice" and choice.args else None
        default = keywords["default"]
        quote = self.lines[default.lineno - 1][default.col_offset:][:1]
        self.add(fn, default, name, "click", flags,
                 _choices(options, quote if quote in ("'", '"') else "'"))


def _annotated_option(annotation: ast.expr | None) -> ast.Call | None:
    """The `typer.Option(...)`/`typer.Argument(...)` of `Annotated[float, typer.Option()]`."""
    if not (isinstance(annotation, ast.Subscript) and _callee(annotation.value) == "Annotated"
            and isinstance(annotation.slice, ast.Tuple)):
        return None
    return next((m for m in annotation.slice.elts[1:] if isinstance(m, ast.Call)
                 and _callee(m) in ("Option", "Argument")), None)


def _choices(options: ast.expr | None, quote: str) -> tuple[str, ...]:
    """`click.Choice([...])`'s values as source text, quoted as the default is."""
    if not isinstance(options, ast.List | ast.Tuple):
        return ()
    values = [literal_value(e) for e in options.elts]
    return tuple(f"{quote}{v}{quote}" if isinstance(v, str) else repr(v)
                 for v in values if v is not None)


def _components(node: ast.expr | None) -> list[str]:
    """The names a `Fire(...)`/`CLI(...)` argument gives: a name, a list or a dict of them."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [e.id for e in node.elts if isinstance(e, ast.Name)]
    if isinstance(node, ast.Dict):
        return [v.id for v in node.values if isinstance(v, ast.Name)]
    return []


def _entry(defs: dict[str, ast.stmt], name: str) -> Function | None:
    """The function a CLI runs for `name`: a function, or a class's `__init__`."""
    node = defs.get(name)
    if isinstance(node, ast.ClassDef):
        node = next((s for s in node.body if isinstance(s, ast.FunctionDef)
                     and s.name == "__init__"), None)
    return node if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else None


def _nested_key(call: ast.Call) -> str:
    key = call.args[1] if len(call.args) > 1 else next(
        (k.value for k in call.keywords if k.arg == "nested_key"), None)
    value = literal_value(key)
    return f"{value}." if isinstance(value, str) and value else ""


def _called(node: ast.Call, imported: set[str]) -> tuple[str, list[str], str] | None:
    """(kind, the names of the functions or classes it runs, the flags' prefix) for a call
    that makes a CLI of functions: `typer.run`, `fire.Fire`, jsonargparse's `CLI`, ..."""
    name, first = _callee(node), node.args[0] if node.args else None
    if name == "run" and "typer" in imported and isinstance(node.func, ast.Attribute):
        return "typer", _components(first), ""
    if name == "Fire" and "fire" in imported:
        given = first or next((k.value for k in node.keywords if k.arg == "component"), None)
        return "fire", _components(given), ""
    if name in ("CLI", "auto_cli") and "jsonargparse" in imported:
        return "jsonargparse", _components(first), ""
    if name in ("add_function_arguments", "add_class_arguments") and isinstance(first, ast.Name):
        return "jsonargparse", [first.id], _nested_key(node)
    return None


def _is_typer_command(fn: Function) -> bool:
    return any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
               and d.func.attr in ("command", "callback") for d in fn.decorator_list)


def cli_knobs(path: str, lines: list[str], tree: ast.Module) -> CliKnobs:
    """Every typer, click, fire and jsonargparse option of one parsed file."""
    reader = _Reader(path, lines)
    imported = _imports(tree)
    defs: dict[str, ast.stmt] = {n.name: n for n in tree.body if isinstance(
        n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    entries: list[tuple[str, str, str]] = []  # (kind, name, prefix)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for deco in node.decorator_list:
                if "click" in imported and isinstance(deco, ast.Call) and \
                        _callee(deco) == "option":
                    reader.click_option(node, deco)
            if "typer" in imported and _is_typer_command(node):
                entries.append(("typer", node.name, ""))
        elif isinstance(node, ast.Call) and (called := _called(node, imported)) is not None:
            kind, names, prefix = called
            entries += [(kind, name, prefix) for name in names]
    for kind, name, prefix in dict.fromkeys(entries):
        fn = _entry(defs, name)
        if fn is not None and kind == "typer":
            reader.typer_command(fn)
        elif fn is not None:
            reader.signature(fn, kind, prefix)
    return reader.found
