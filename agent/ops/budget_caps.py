"""What ends a script's training before its budget: the step or epoch count of its loop.

A script that reads OVERNIGHT_BUDGET_S stops its training loop with a check of the budget (an
`if` that reads it and breaks or returns, or a `while` whose test reads it). The loops around
that check, up to its function, make the training loop; the outermost one is what ends
training: a `for` over `range(epochs)` or over a finite iterable (one pass over a loader), or
a `while True:` with another `if ...: break` (`if step >= max_steps: break`) is a cap, and it
ends training before the budget when the run is shorter than the budget. A `while` whose test
reads the budget, a `for` over `itertools.count()` or over a `range` of a million or more, are
not. A script that does not read the budget: its training loop as adopt finds it
(agent.ops.adopt_contract). `short_run` is doctor's finding for a run that trained less than
half its budget (agent.rules.contract's underrun) and adopt's note on a probe that ended by
itself uses the same words, with where the count's live knob is set. Pure, over the files'
text and the knob chain's states.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass

from agent.ops.adopt_contract import training_loop
from agent.proposers.knob_chain import KnobState, flag_key
from agent.rules.contract import underrun

BUDGET_VARIABLE = "OVERNIGHT_BUDGET_S"
ENDLESS = 1_000_000  # a range this long is no cap
Loop = ast.For | ast.While


@dataclass(frozen=True)
class Cap:
    """The statement whose count ends training, and how the budget check sits in it."""

    path: str
    line: int  # 1-based
    code: str  # the loop's header, or the `if` that breaks it
    count: str | None  # the name of the count (`epochs`), None for a literal or an iterable
    loop_line: int  # the capped loop's line
    check_line: int | None  # the budget check's line (None: the script reads no budget)
    nested: bool = False  # the budget check breaks an inner loop only


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _budget_names(tree: ast.Module) -> set[str]:
    """Names whose value comes from OVERNIGHT_BUDGET_S (`budget = float(os.environ[...])`,
    then `deadline = t0 + budget`)."""
    assigns = [(t.id, n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
               for t in n.targets if isinstance(t, ast.Name)]
    found: set[str] = set()
    while True:
        more = {name for name, value in assigns if name not in found and (
            _names(value) & found or any(isinstance(c, ast.Constant) and c.value ==
                                          BUDGET_VARIABLE for c in ast.walk(value)))}
        if not more:
            return found
        found |= more


def _reads_budget(node: ast.AST, names: set[str]) -> bool:
    return bool(_names(node) & names) or any(
        isinstance(c, ast.Constant) and c.value == BUDGET_VARIABLE for c in ast.walk(node))


def _exits(node: ast.If) -> bool:
    return any(isinstance(n, ast.Break | ast.Return | ast.Raise) for b in node.body
               for n in ast.walk(b))


def _parents(tree: ast.Module) -> dict[int, ast.AST]:
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _loops_around(node: ast.AST, parents: dict[int, ast.AST]) -> list[Loop]:
    """The loops around `node`, innermost first, up to its function."""
    loops: list[Loop] = []
    parent = parents.get(id(node))
    while parent is not None and not isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef
                                                | ast.Lambda):
        if isinstance(parent, ast.For | ast.While):
            loops.append(parent)
        parent = parents.get(id(parent))
    return loops


def _count_name(expr: ast.expr) -> str | None:
    """The name an expression takes its count from: `epochs` of `epochs + 1`,
    `args.epochs` or `cfg.train.epochs`; None for a literal."""
    called = {id(n.func) for n in ast.walk(expr) if isinstance(n, ast.Call)}
    for node in ast.walk(expr):
        if isinstance(node, ast.Attribute) and id(node) not in called:
            return node.attr
    names = [n.id for n in ast.walk(expr) if isinstance(n, ast.Name) and id(n) not in called]
    return names[0] if names else None


def _range_count(loop: ast.For) -> tuple[bool, str | None]:
    """(is it a cap, the count's name) for a `for` loop."""
    it = loop.iter
    if isinstance(it, ast.Call) and getattr(it.func, "attr", getattr(it.func, "id", "")) in (
            "count", "cycle", "repeat"):
        return False, None
    if isinstance(it, ast.Call) and getattr(it.func, "id", "") == "range" and it.args:
        stop = it.args[1] if len(it.args) > 1 else it.args[0]
        if isinstance(stop, ast.Constant) and isinstance(stop.value, int | float):
            return stop.value < ENDLESS, None
        if isinstance(stop, ast.BinOp) and isinstance(stop.right, ast.Constant) and \
                isinstance(stop.left, ast.Constant):
            return False, None  # 10**9
        return True, _count_name(stop)
    return True, None


def _count_break(loop: ast.While, names: set[str]) -> ast.If | None:
    """`if step >= max_steps: break` in a `while True:` loop: an exit on a comparison of a
    counter the loop increments (not the budget, not a diverging loss)."""
    counters = {n.target.id for n in ast.walk(loop)
                if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)}
    for node in ast.walk(loop):
        if isinstance(node, ast.If) and _exits(node) and isinstance(node.test, ast.Compare) \
                and not _reads_budget(node.test, names) and _names(node.test) & counters:
            return node
    return None


def _cap_of(path: str, text: str, loop: Loop, check: ast.AST | None, names: set[str],
            nested: bool) -> Cap | None:
    lines = text.splitlines()
    check_line = getattr(check, "lineno", None)
    if isinstance(loop, ast.For):
        capped, count = _range_count(loop)
        return Cap(path, loop.lineno, lines[loop.lineno - 1].strip(), count, loop.lineno,
                   check_line, nested) if capped else None
    if _reads_budget(loop.test, names):
        return None
    stop = _count_break(loop, names) if not (isinstance(loop.test, ast.Constant)
                                             and loop.test.value is False) else None
    if stop is None and isinstance(loop.test, ast.Compare):  # while step < max_steps:
        return Cap(path, loop.lineno, lines[loop.lineno - 1].strip(),
                   _count_name(loop.test.comparators[-1]), loop.lineno, check_line, nested)
    if stop is None or not isinstance(stop.test, ast.Compare):
        return None
    return Cap(path, stop.lineno, lines[stop.lineno - 1].strip(),
               _count_name(stop.test.comparators[-1]), loop.lineno, check_line, nested)


def _checks(tree: ast.Module, names: set[str]) -> list[ast.AST]:
    return [n for n in ast.walk(tree) if (isinstance(n, ast.If) and _exits(n) or isinstance(
        n, ast.While)) and _reads_budget(n.test, names)]


def find_cap(files: dict[str, str]) -> Cap | None:
    """The first cap of a training loop in the Python files (see the module docstring)."""
    for path, text in files.items():
        try:
            tree = ast.parse(text) if path.endswith(".py") else None
        except SyntaxError:
            continue
        if tree is None:
            continue
        names = _budget_names(tree)
        parents = _parents(tree)
        for check in _checks(tree, names):
            loops = _loops_around(check, parents)
            if isinstance(check, ast.While):
                loops = [check, *loops]
            if loops:
                leaves = isinstance(check, ast.If) and any(
                    isinstance(n, ast.Return | ast.Raise) for b in check.body for n in ast.walk(b))
                return _cap_of(path, text, loops[-1], check, names,
                               nested=len(loops) > 1 and not leaves)
        if BUDGET_VARIABLE not in text and (loop := training_loop(tree)) is not None:
            return _cap_of(path, text, loop, None, names, nested=False)
    return None


def cap_advice(cap: Cap | None, count_at: str | None = None) -> tuple[str, str]:
    """(what ends training, how to let the budget end it) for a run that trained less than
    its budget; `count_at`: where the count's live value is set (`train.py:27`)."""
    if cap is None:
        return ("the script reads OVERNIGHT_BUDGET_S, so something else ends training first (a "
                "step or epoch count, an early stop, data that runs out)",
                "let the budget end training: loop until the budget check stops it")
    where = f"{cap.path}:{cap.line}"
    count = f"{cap.count}" + (f" ({count_at})" if count_at else "")
    higher = f", or set {count} so high that the budget always ends training first" \
        if cap.count else ""
    if cap.code.startswith("for ") and cap.count:
        how = f"loop with `itertools.count()` instead of `range(...)` at {where}"
    elif cap.code.startswith("for "):
        how = (f"put the loop at {where} inside `for epoch in itertools.count():` and break "
               "that one too when the budget is spent")
    else:
        how = f"drop the {cap.count or 'count'} condition at {where}"
    also = (f", and break that loop too when the budget is spent (the check at line "
            f"{cap.check_line} breaks only the loop inside it)") if cap.nested else ""
    return f"`{cap.code}` ({where}) ends training first", f"let the budget end training: {how}" \
        f"{also}{higher}"


def count_site(cap: Cap | None, states: list[KnobState]) -> str | None:
    """Where the live knob of the cap's count is set (`train.py:27`), if it is one."""
    if cap is None or cap.count is None:
        return None
    return next((s.knob.where for s in states if s.live
                 and flag_key(s.knob.name).rsplit(".", 1)[-1] == cap.count), None)


def short_run(budget_s: float, files: dict[str, str], summary: Mapping[str, float | str],
              states: list[KnobState]) -> tuple[str, str] | None:
    """(detail, fix) for a run that trained less than half its budget although the script
    reads OVERNIGHT_BUDGET_S: the count that ends it first, with its file and line (None: the
    run trained long enough, or the script reads no budget: read it is the fix then)."""
    trained = summary.get("training_seconds")
    code = {p: t for p, t in files.items() if p.endswith(".py")}
    if not isinstance(trained, int | float) or underrun(float(trained), budget_s) is None \
            or not any(BUDGET_VARIABLE in t for t in code.values()):
        return None
    cap = find_cap(code)
    what, fix = cap_advice(cap, count_site(cap, states))
    return f"trained only {trained:g} s of a {budget_s:g} s budget: {what}", fix
