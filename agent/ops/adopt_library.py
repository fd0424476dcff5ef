"""The contract's lines for a script whose training loop lives in a library module of its repo.

minGPT's shape: `projects/chargpt/chargpt.py` builds a `Trainer` from `mingpt/trainer.py` and
calls `trainer.run()`, whose `while True:` is the training loop. The budget is read and kept in
the library (before its loop, and a `break` as the loop body's last statement, with the imports
that file lacks), and a method notes its training time on its object as the loop ends
(`self.overnight_trained_s`; a plain function is timed around its call in the script instead);
after the call that runs the loop, the script evaluates once more when it computes the metric
only in a callback, and prints the summary block (the training time and the step counter read
from the trainer object, e.g. `trainer.iter_num`). Pure, over the files' text.
"""

from __future__ import annotations

import ast
import re

from agent.ops.adopt_contract import (
    Metric,
    Todo,
    free_name,
    imports_todo,
    indent_of,
    training_loop,
)


def _in(path: str, todo: Todo) -> Todo:
    return Todo(todo.what, todo.lines, f"in {path}, {todo.where}" if todo.where else f"in {path}")


def _owner(tree: ast.Module, loop: ast.AST) -> ast.FunctionDef | None:
    """The innermost function whose body holds the loop."""
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(n is loop for n in ast.walk(node)):
            found = node if found is None or node.lineno > found.lineno else found
    return found


def _counter(loop: ast.For | ast.While) -> str | None:
    """`self.iter_num += 1` in the loop body: the attribute that counts steps."""
    for stmt in loop.body:
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Attribute) and \
                isinstance(stmt.target.value, ast.Name) and stmt.target.value.id == "self":
            return stmt.target.attr
    return None


def _the_call(tree: ast.Module, name: str) -> tuple[ast.stmt, str | None] | None:
    """The script's statement that calls `<obj>.name(...)` (or `name(...)`), and `obj`."""
    for stmt in ast.walk(tree):
        if not isinstance(stmt, ast.Expr | ast.Assign) or not isinstance(stmt.value, ast.Call):
            continue
        func = stmt.value.func
        if isinstance(func, ast.Attribute) and func.attr == name:
            return stmt, func.value.id if isinstance(func.value, ast.Name) else None
        if isinstance(func, ast.Name) and func.id == name:
            return stmt, None
    return None


def _computed_in_function(tree: ast.Module, name: str) -> tuple[ast.Assign, str] | None:
    """An assignment to `name` inside a function of the script (a callback), and its name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == name for t in inner.targets):
                    return inner, node.name
    return None


def _library_loop(library: dict[str, str]) -> tuple[str, str, ast.Module, ast.For | ast.While
                                                   ] | None:
    for path, text in library.items():
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        loop = training_loop(tree)
        if loop is not None:
            return path, text, tree, loop
    return None


def library_todos(text: str, library: dict[str, str], metric: Metric | None) -> list[Todo]:
    """Budget lines for the library's loop, timing and summary lines for the script."""
    found = _library_loop(library)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    if found is None:
        return []
    path, lib, lib_tree, loop = found
    owner = _owner(lib_tree, loop)
    call = _the_call(tree, owner.name) if owner is not None else None
    if call is None:
        return []
    lib_lines, lines = lib.splitlines(), text.splitlines()
    t0, budget = free_name(lib, "overnight_t0"), free_name(lib, "overnight_budget_s")
    pad, inner = indent_of(lib_lines, loop.lineno), indent_of(lib_lines, loop.body[0].lineno)
    todos = [_in(path, t) for t in imports_todo(lib)] + [
        _in(path, Todo("read the training budget just before the training loop",
                       [f"{pad}{budget} = float(os.environ.get('OVERNIGHT_BUDGET_S', 'inf'))",
                        f"{pad}{t0} = time.time()"],
                       f"before line {loop.lineno}, `{lib_lines[loop.lineno - 1].strip()}`")),
        _in(path, Todo("stop when it is spent, as the last statement of the loop body",
                       [f"{inner}if time.time() - {t0} > {budget}:", f"{inner}    break"],
                       f"after line {loop.body[-1].end_lineno}"))]
    stmt, obj = call
    s_pad = indent_of(lines, stmt.lineno)
    after = f"after line {stmt.end_lineno}, where `{lines[stmt.lineno - 1].strip()}` ends"
    method = owner is not None and bool(owner.args.args) and owner.args.args[0].arg == "self"
    if method and obj:  # the library notes its own training time on the object
        attr = free_name(lib, "overnight_trained_s")
        todos.append(_in(path, Todo("note the training time as soon as the loop ends",
                                    [f"{pad}self.{attr} = time.time() - {t0}"],
                                    f"after line {loop.end_lineno}, where the loop ends")))
        trained = f"{obj}.{attr}"
    else:
        s_t0, trained = free_name(text, "overnight_t0"), free_name(text, "overnight_trained_s")
        todos += [*imports_todo(text, ("time",)),
                  Todo(f"time the training: line {stmt.lineno} runs the loop of {path}",
                       [f"{s_pad}{s_t0} = time.time()"],
                       f"before line {stmt.lineno}, `{lines[stmt.lineno - 1].strip()}`"),
                  Todo("note the training time as soon as it returns",
                       [f"{s_pad}{trained} = time.time() - {s_t0}"], after)]
        after = "next"
    todos += _summary(tree, text, metric, s_pad, trained,
                      f"{obj}.{_counter(loop)}" if obj and _counter(loop) else None, after)
    return todos


def _summary(tree: ast.Module, text: str, metric: Metric | None, pad: str, trained: str,
             steps: str | None, where: str) -> list[Todo]:
    todos = []
    if metric and metric.expr:
        root = re.match(r"[A-Za-z_]\w*", metric.expr)
        inside = _computed_in_function(tree, root.group(0)) if root else None
        if inside is not None:
            assign, func = inside
            todos.append(Todo(f"the final evaluation: the script computes {metric.printed} only "
                              f"in {func} (line {assign.lineno}), so evaluate once more",
                              [pad + (ast.get_source_segment(text, assign) or "").strip()],
                              where))
            where = "next"
        q = '"' if "'" in metric.expr else "'"
        value = f"{pad}print(f{q}{metric.name}: {{{metric.expr}:.6f}}{q})"
    else:
        value = f"{pad}print(f'{metric.name if metric else '<metric>'}: {{<its value>:.6f}}')"
    block = [f"{pad}print('---')", value, f"{pad}print(f'training_seconds: {{{trained}:.1f}}')"]
    if steps:
        block.append(f"{pad}print(f'num_steps: {{{steps}}}')  # throughput: steps per run")
    return [*todos, Todo("print the summary block after the final evaluation", block, where)]
