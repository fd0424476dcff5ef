"""Attribute-style configs: `C.trainer.learning_rate = 5e-4` and the order a run sets each key.

minGPT's CfgNode, yacs, ml_collections' ConfigDict, OmegaConf and EasyDict configs are objects
whose keys are set by attribute: `C = CN()`, then `C.model.n_layer = 6`. A section may be
filled by a function returning its defaults (`C.trainer = Trainer.get_default_config()`, in a
library module), and `--trainer.learning_rate=1e-3` flags are merged in where the script calls
`merge_from_args` (or yacs' `merge_from_list`, OmegaConf's `from_cli`). Per file, each scope
(the module, each function) becomes a list of events in statement order: a key set (to a
literal: a knob; a tuple of literals: one knob per element, `betas[1]`), a section made empty
or filled by a config function (a mount), a call of a function of the same file, the flags
merged. `flatten` inlines them from the script's module scope, so each knob gets its full key
(`trainer.learning_rate` for a default in `Trainer.get_default_config`) and its place in the
order a run executes. Pure: the stdlib, agent.core.diff and knob_base.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Literal

from agent.core.diff import split_lines
from agent.proposers.knob_base import Knob, knob_at

# Calls that make an empty config object (the last name of the callee).
CONFIG_CLASSES = frozenset({
    "CN", "CfgNode", "ConfigDict", "FrozenConfigDict", "EasyDict", "edict", "AttrDict",
    "SimpleNamespace", "DotMap", "Box", "Munch", "DictConfig"})
OMEGACONF = frozenset({"create", "structured", "load", "merge"})  # OmegaConf.<these>(...)
# Functions that return a config (by name; plus any function of the file that returns one).
CONFIG_GETTER = re.compile(r"^(get_\w*(config|cfg)\w*|\w*_(config|cfg)|default_config)$", re.I)
FLAG_MERGES = frozenset({"merge_from_args", "merge_from_list", "from_cli"})
_CONFIG_WORDS = re.compile(r"\b(?:" + "|".join(sorted(CONFIG_CLASSES)) + r"|OmegaConf)\b|"
                           r"(?:get_\w*(?:config|cfg)|_(?:config|cfg)|default_config)\s*\(", re.I)
COPIES = frozenset({"clone", "copy", "deepcopy"})
MAX_DEPTH = 8  # nested mounts followed from the script

MODULE = "<module>"  # a call event's target: the module scope of the same file
EventKind = Literal["set", "mount", "reset", "call", "flags"]


@dataclass(frozen=True)
class AttrEvent:
    """One thing a scope does to its config, in statement order."""

    kind: EventKind
    key: str  # dotted, relative to the scope's config root ("" for the root itself)
    line: int  # 0-based
    sure: bool  # not under an `if`/loop/except: it always happens
    target: str = ""  # mount / call: the function's dotted name (`Trainer.get_default_config`)
    knobs: tuple[Knob, ...] = ()  # set: the literals it writes (none: any other value)


@dataclass
class AttrFacts:
    """One file's scopes (qualified name -> events; "" is the module) and its config getters."""

    path: str = ""
    scopes: dict[str, list[AttrEvent]] = field(default_factory=dict)
    getters: set[str] = field(default_factory=set)  # qualified names that return a config


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` for a chain of attributes on a name; None for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _callee(node: ast.expr) -> str | None:
    return _dotted(node.func) if isinstance(node, ast.Call) else None


def _is_new_config(node: ast.expr) -> bool:
    name = _callee(node)
    if name is None:
        return False
    last = name.rsplit(".", 1)[-1]
    return last in CONFIG_CLASSES or (name.startswith("OmegaConf.") and last in OMEGACONF)


def _has_flags(node: ast.AST) -> bool:
    return any((_callee(n) or "").rsplit(".", 1)[-1] in FLAG_MERGES
               for n in ast.walk(node) if isinstance(n, ast.Call))


def _copied(node: ast.expr) -> str | None:
    """The name a copy is made of: `X.clone()`, `X.copy()`, `copy.deepcopy(X)`."""
    if not isinstance(node, ast.Call):
        return None
    if isinstance(node.func, ast.Attribute) and node.func.attr in COPIES and not node.args:
        return _dotted(node.func.value)
    if (_callee(node) or "").rsplit(".", 1)[-1] == "deepcopy" and node.args:
        return _dotted(node.args[0])
    return None


def _is_main_guard(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__")


class _Scope:
    """Walks one scope's statements in order, knowing which local names hold a config."""

    def __init__(self, path: str, lines: list[str], getters: set[str], known: set[str],
                 roots: dict[str, str] | None = None) -> None:
        self.path, self.lines, self.getters, self.known = path, lines, getters, known
        self.outer = dict(roots or {})  # the module's config names, seen from a function
        self.roots: dict[str, str] = dict(self.outer)  # name -> key it holds ("": all of it)
        self.events: list[AttrEvent] = []
        self.returns_config = False

    def _getter(self, node: ast.expr) -> str | None:
        name = _callee(node)
        if name is None:
            return None
        last = name.rsplit(".", 1)[-1]
        return name if CONFIG_GETTER.match(last) or name in self.getters or \
            last in self.getters else None

    def _key(self, target: ast.expr) -> str | None:
        """The config key an assignment target names (`C.model.n_layer` -> `model.n_layer`)."""
        name = _dotted(target)
        if name is None or "." not in name:
            return None
        root, rest = name.split(".", 1)
        if root not in self.roots:
            return None
        return f"{self.roots[root]}.{rest}" if self.roots[root] else rest

    def _literals(self, key: str, value: ast.expr) -> tuple[Knob, ...]:
        if isinstance(value, ast.Tuple | ast.List):
            found = [knob_at(self.path, self.lines, e, f"{key}[{i}]", "attr")
                     for i, e in enumerate(value.elts)]
            return tuple(k for k in found if k is not None) if all(found) else ()
        knob = knob_at(self.path, self.lines, value, key, "attr")
        return (knob,) if knob is not None else ()

    def _calls(self, stmt: ast.stmt, line: int, sure: bool, skip: ast.expr | None = None) -> None:
        """Calls of functions that set config keys (of any known file), inlined by flatten."""
        if not self.known:
            return
        for node in ast.walk(stmt):
            name = _callee(node) if isinstance(node, ast.Call) and node is not skip else None
            if name and (name in self.known or name.split(".", 1)[-1] in self.known):
                self.events.append(AttrEvent("call", "", line, sure, target=name))

    def _bind(self, name: str, value: ast.expr, line: int, sure: bool) -> None:
        getter = self._getter(value)
        copy_of = _copied(value)
        if _is_new_config(value) or getter:
            self.roots[name] = ""
            if getter:
                self.events.append(AttrEvent("mount", "", line, sure, target=getter))
            if _has_flags(value):
                self.events.append(AttrEvent("flags", "", line, sure))
        elif copy_of is not None and copy_of in self.roots:
            self.roots[name] = self.roots[copy_of]
        elif isinstance(value, ast.Attribute) and self._key(value) is not None:
            self.roots[name] = self._key(value) or ""
        else:
            self.roots.pop(name, None)

    def _assign(self, targets: list[ast.expr], value: ast.expr, line: int, sure: bool) -> None:
        for target in targets:
            if isinstance(target, ast.Name):
                self._bind(target.id, value, line, sure)
                continue
            key = self._key(target)
            if key is None:
                continue
            getter = self._getter(value)
            if _is_new_config(value):
                self.events.append(AttrEvent("reset", key, line, sure))
            elif getter:
                self.events.append(AttrEvent("mount", key, line, sure, target=getter))
            else:
                self.events.append(AttrEvent("set", key, line, sure,
                                             knobs=self._literals(key, value)))

    def _return(self, value: ast.expr, line: int) -> None:
        name = _dotted(value) if isinstance(value, ast.Name) else _copied(value)
        if name is None or self.roots.get(name) != "":
            return
        self.returns_config = True
        if name in self.outer:  # yacs: `return _C.clone()` hands out the module's defaults
            self.events.insert(0, AttrEvent("call", "", line, True, target=MODULE))

    def simple(self, stmt: ast.stmt, sure: bool) -> None:
        line = stmt.lineno - 1
        value = getattr(stmt, "value", None)
        mounted = value if isinstance(stmt, ast.Assign | ast.AnnAssign) and value is not None \
            and (self._getter(value) or _is_new_config(value)) else None
        self._calls(stmt, line, sure, skip=mounted)
        if isinstance(stmt, ast.Assign):
            self._assign(stmt.targets, stmt.value, line, sure)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            self._assign([stmt.target], stmt.value, line, sure)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            name = _callee(stmt.value) or ""
            owner, _, method = name.rpartition(".")
            if method in FLAG_MERGES and (owner.split(".")[0] in self.roots or
                                          owner == "OmegaConf"):
                self.events.append(AttrEvent("flags", "", line, sure))
        elif isinstance(stmt, ast.Return) and stmt.value is not None:
            self._return(stmt.value, line)

    def walk(self, body: list[ast.stmt], sure: bool = True) -> None:
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if isinstance(stmt, ast.If):
                self.walk(stmt.body, sure and _is_main_guard(stmt.test))
                self.walk(stmt.orelse, False)
            elif isinstance(stmt, ast.With | ast.AsyncWith):
                self.walk(stmt.body, sure)
            elif isinstance(stmt, ast.For | ast.AsyncFor | ast.While):
                self.walk(stmt.body + stmt.orelse, False)
            elif isinstance(stmt, ast.Try):
                self.walk(stmt.body, sure)
                self.walk([s for h in stmt.handlers for s in h.body] + stmt.orelse, False)
                self.walk(stmt.finalbody, sure)
            else:
                self.simple(stmt, sure)


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function by qualified name: `f`, or `Cls.f` for a method (nested ones by name)."""
    methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    plain: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    methods[f"{node.name}.{item.name}"] = item
                    inside.add(id(item))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and id(node) not in inside:
            plain.setdefault(node.name, node)
    return {**methods, **{q: n for q, n in plain.items() if q not in methods}}


def _mentions_config(text: str, names: frozenset[str]) -> bool:
    """Cheap: can this file hold an attribute config (a config class, OmegaConf, a getter)?"""
    return bool(_CONFIG_WORDS.search(text)) or any(
        n.rsplit(".", 1)[-1] in text for n in names)


def attr_facts(path: str, text: str, tree: ast.Module, known: frozenset[str] = frozenset(),
               getters: frozenset[str] = frozenset()) -> AttrFacts:
    """The events of each scope of one parsed file. `known`: the functions (of any file) that
    set config keys, so calls of them are followed; `getters`: those that return a config."""
    if not _mentions_config(text, known | getters):
        return AttrFacts(path)
    lines = split_lines(text)
    functions = _functions(tree)
    outer = _Scope(path, lines, set(getters), set(known))
    outer.walk(tree.body)  # the module's own config names, for the functions that use them
    found = set(getters)
    for _ in range(3):  # a getter may build on another getter of the same file
        scopes: dict[str, list[AttrEvent]] = {}
        returning = set()
        for qual, node in functions.items():
            scope = _Scope(path, lines, found, set(known), outer.roots)
            scope.walk(node.body)
            scopes[qual] = scope.events
            if scope.returns_config:
                returning |= {qual, qual.rsplit(".", 1)[-1]}
        if returning <= found:
            break
        found |= returning
    module = _Scope(path, lines, found, set(known))
    module.walk(tree.body)
    scopes[""] = module.events
    return AttrFacts(path, {q: e for q, e in scopes.items() if e},
                     {q for q in functions if q in found or q.rsplit(".", 1)[-1] in found})


def attr_knobs(facts: AttrFacts) -> list[Knob]:
    """Every knob of a file's attribute configs, named by its key within its own scope."""
    return [k for events in facts.scopes.values() for e in events for k in e.knobs]


@dataclass(frozen=True)
class Step:
    """An event as a run meets it: its full key, and the file that holds it."""

    key: str
    event: AttrEvent
    path: str
    sure: bool


def _lookup(facts: dict[str, AttrFacts], name: str, here: str, qual: str
            ) -> tuple[str, str] | None:
    """(file, qualified name) of the function a call names, this file first."""
    if name == MODULE:
        return here, ""
    first, _, rest = name.partition(".")
    if first in ("self", "cls") and "." in qual:  # a method of the same class
        name = f"{qual.split('.')[0]}.{rest}"
    for path in [here, *sorted(p for p in facts if p != here)]:
        scopes = facts[path].scopes
        if name in scopes:
            return path, name
        if rest and rest in scopes and path != here:  # `module.get_config`
            return path, rest
    return None


def flatten(facts: dict[str, AttrFacts], script: str | None) -> list[Step]:
    """The script's config events in the order a run executes them, mounts and calls inlined."""
    if script is None or script not in facts:
        return []
    steps: list[Step] = []
    active: list[tuple[str, str]] = []

    def visit(path: str, qual: str, prefix: str, sure: bool) -> None:
        active.append((path, qual))
        for event in facts[path].scopes.get(qual, []):
            key = ".".join(p for p in (prefix, event.key) if p)
            steps.append(Step(key, event, path, sure and event.sure))
            found = _lookup(facts, event.target, path, qual) if event.target else None
            if found and found not in active and len(active) < MAX_DEPTH:
                visit(*found, key if event.kind == "mount" else prefix, sure and event.sure)
        active.pop()

    visit(script, "", "", True)
    return steps


def scope_of(facts: AttrFacts, knob: Knob) -> str:
    """The function (qualified name; "" for the module) whose events hold a knob."""
    return next((q for q, events in facts.scopes.items()
                 if any(knob in e.knobs for e in events)), "")


def covers(setter: str, key: str) -> bool:
    """Does setting `setter` set `key` (itself, an element `key[i]`, or a section above it)?"""
    return key == setter or key.startswith(setter + ".") or key.startswith(setter + "[")
