"""What a training script lacks of the contract, as lines to add and where: pure, over its text.

Finds the metric the script prints (`val loss 1.2`, `val_loss: 1.2`, `val_loss=1.2`, a dict key
`"eval_loss"`, Lightning's `self.log("val/acc", ...)`) and the expression holding its value, the
training loop (the outermost `for`/`while` with a `.backward(`/`.step(` in it), its step
counter, the seeding calls, and then says: where to read the budget (names that do not collide
with the script's own), where to stop, the final evaluation when the metric is only computed
inside the loop, the summary block (metric, training_seconds, num_steps), and the seed.
Scripts driven by a trainer object (Hugging Face `Trainer`, Lightning) get that trainer's way.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

_KIND = r"(?:loss|ppl|perplexity|bpb|acc\w*|error|f1|score)"
METRIC_TEXT = re.compile(rf"\b((?:val|valid|validation|test|eval)[ _/]?{_KIND})\b", re.I)
TRAIN_LOSS_TEXT = re.compile(r"\b((?:train|training)[ _/]?loss)\b", re.I)
SEED_CALLS = ("manual_seed", "set_seed", "seed_everything", "seed")


@dataclass(frozen=True)
class Metric:
    name: str  # the summary-block key: `val loss` -> val_loss, `val/acc` -> val_acc
    printed: str  # as the script writes it
    expr: str  # the expression holding its value ("" when unknown)
    line: int  # 1-based line of the print or log call (0: unknown)


@dataclass
class Todo:
    """One thing to add: what, and the lines (already indented) with where they go."""

    what: str
    lines: list[str] = field(default_factory=list)
    where: str = ""


def key_of(printed: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", printed.strip()).lower()


def _fstring_metrics(tree: ast.Module, src: str, pattern: re.Pattern[str] = METRIC_TEXT
                     ) -> list[Metric]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.JoinedStr):
            continue
        parts = node.values
        for i, part in enumerate(parts[:-1]):
            nxt = parts[i + 1]
            if not (isinstance(part, ast.Constant) and isinstance(nxt, ast.FormattedValue)):
                continue
            m = re.search(rf"({pattern.pattern})\s*[:=]?\s*$", str(part.value), re.I)
            if m:
                expr = ast.get_source_segment(src, nxt.value) or ""
                found.append(Metric(key_of(m.group(1)), m.group(1), expr, node.lineno))
    return found


def _string_metrics(tree: ast.Module) -> list[Metric]:
    """Metric names as string literals: dict keys, `self.log("val/acc", ...)`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                METRIC_TEXT.fullmatch(node.value):
            found.append(Metric(key_of(node.value), node.value, "", node.lineno))
    return found


def find_metrics(text: str) -> list[Metric]:
    """Every metric-like name the script prints or logs, printed values first (val, eval, test)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return [Metric(key_of(m), m, "", 0) for m in METRIC_TEXT.findall(text)]
    found = _fstring_metrics(tree, text) + _string_metrics(tree)
    rank = {"val": 0, "valid": 0, "validation": 0, "eval": 1, "test": 2}
    return sorted(found, key=lambda m: (m.expr == "", rank.get(re.split(r"[ _/]", m.printed)[0]
                                                              .lower(), 3)))


def training_loss(text: str) -> Metric | None:
    """The training loss a script prints (`train loss {loss.item():.4f}`): the metric of last
    resort for a script that evaluates on no held-out data."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    found = _fstring_metrics(tree, text, TRAIN_LOSS_TEXT)
    return found[0] if found else None


def training_loop(tree: ast.Module) -> ast.For | ast.While | None:
    """The outermost loop whose body calls `.backward(` or an optimizer's `.step(`."""
    for node in ast.walk(tree):  # breadth first: outer loops come first
        if isinstance(node, ast.For | ast.While) and any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr in ("backward", "step") for n in ast.walk(node)):
            return node
    return None


def step_counter(loop: ast.For | ast.While) -> str | None:
    """`iter_num += 1` at the top of the loop body, or the `for` target."""
    for stmt in loop.body:
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            return stmt.target.id
    if isinstance(loop, ast.For) and isinstance(loop.target, ast.Name):
        return loop.target.id
    return None


def free_name(text: str, base: str) -> str:
    """`base`, or `base_2`, ... : a name the script does not use."""
    name, k = base, 2
    while re.search(rf"\b{name}\b", text):
        name, k = f"{base}_{k}", k + 1
    return name


def imports_todo(text: str, names: tuple[str, ...] = ("os", "time")) -> list[Todo]:
    """`import os, time` where the file's own imports end, for the names it lacks at module
    level (an import inside a function would make the name local to all of that function)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    have = {a.asname or a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    missing = [n for n in names if n not in have]
    if not missing:
        return []
    tops = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    where = f"after line {tops[-1].end_lineno}, the last top-level import" if tops else \
        "before line 1"
    return [Todo("import what the lines below use", [f"import {', '.join(missing)}"], where)]


def indent_of(lines: list[str], line_no: int) -> str:
    line = lines[line_no - 1]
    return line[: len(line) - len(line.lstrip())]


def _assigned_in(loop: ast.AST, name: str) -> ast.Assign | None:
    for node in ast.walk(loop):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node
    return None


def _condition(loop: ast.AST, node: ast.AST, text: str) -> str:
    """`, under `if iter_num % eval_interval == 0`` when an `if` in the loop guards `node`."""
    for stmt in ast.walk(loop):
        if isinstance(stmt, ast.If) and any(n is node for n in ast.walk(stmt)):
            return f", under `if {ast.get_source_segment(text, stmt.test)}`"
    return ""


def loop_todos(text: str, metric: Metric | None, t0: str, budget: str) -> list[Todo]:
    """Budget, final evaluation and summary for a script with its own training loop."""
    tree = ast.parse(text)
    loop = training_loop(tree)
    if loop is None:
        return []
    lines = text.splitlines()
    pad = indent_of(lines, loop.lineno)
    inner = indent_of(lines, loop.body[0].lineno)
    todos = [*imports_todo(text),
             Todo("read the training budget just before the training loop (names chosen not to "
                  "collide with the script's own)",
                  [f"{pad}{budget} = float(os.environ.get('OVERNIGHT_BUDGET_S', 'inf'))",
                   f"{pad}{t0} = time.time()"],
                  f"before line {loop.lineno}, `{lines[loop.lineno - 1].strip()}`"),
             Todo("stop when it is spent, as the last statement of the loop body",
                  [f"{inner}if time.time() - {t0} > {budget}:", f"{inner}    break"],
                  f"after line {loop.body[-1].end_lineno}")]
    trained = free_name(text, "overnight_trained_s")
    todos.append(Todo("note the training time as soon as the loop ends (before any evaluation)",
                      [f"{pad}{trained} = time.time() - {t0}"],
                      f"after line {loop.end_lineno}, where the loop ends"))
    summary: list[str] = []
    if metric and metric.expr:
        root = re.match(r"[A-Za-z_]\w*", metric.expr)
        assign = _assigned_in(loop, root.group(0)) if root else None
        if assign is not None:
            todos.append(Todo(f"the final evaluation: the script computes {metric.printed} only "
                              f"inside the loop{_condition(loop, assign, text)} (line "
                              f"{assign.lineno}), so evaluate once more after it",
                              [pad + (ast.get_source_segment(text, assign) or "").strip()],
                              "next"))
        q = '"' if "'" in metric.expr else "'"
        summary.append(f"{pad}print(f{q}{metric.name}: {{{metric.expr}:.6f}}{q})")
    else:
        name = metric.name if metric else "<metric>"
        summary.append(f"{pad}print(f'{name}: {{<its value>:.6f}}')")
    counter = step_counter(loop)
    summary = [f"{pad}print('---')", *summary,
               f"{pad}print(f'training_seconds: {{{trained}:.1f}}')"]
    if counter:
        summary.append(f"{pad}print(f'num_steps: {{{counter}}}')  # throughput: steps per run")
    todos.append(Todo("print the summary block after the final evaluation", summary, "next"))
    return todos


def _line_of(text: str, pattern: str) -> int:
    """1-based line of the statement ending the first match of `pattern` (0: none)."""
    m = re.search(pattern, text)
    if not m:
        return 0
    line = text.count("\n", 0, m.start()) + 1
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return line
    ends = [n.end_lineno or n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.stmt) and not isinstance(n, ast.FunctionDef | ast.ClassDef
                                                          | ast.If | ast.For | ast.While)
            and n.lineno <= line <= (n.end_lineno or n.lineno)]
    return min(ends) if ends else line


def trainer_todos(text: str, metric: Metric | None, t0: str, budget: str) -> list[Todo]:
    """Hugging Face Trainer: a callback that stops at the budget, and the block after evaluate."""
    name = metric.name if metric else "eval_loss"
    made = _line_of(text, r"\btrainer\s*=\s*Trainer\(")
    evaluated = _line_of(text, r"=\s*trainer\.evaluate\(")
    seconds = ("train_result.metrics['train_runtime']" if "train_result" in text
               else f"time.time() - {t0}")
    return [
        *imports_todo(text),
        Todo("stop the Trainer when the budget is spent: a callback",
             ["from transformers import TrainerCallback",
              f"{budget} = float(os.environ.get('OVERNIGHT_BUDGET_S', 'inf'))",
              f"{t0} = time.time()", "class OvernightBudget(TrainerCallback):",
              "    def on_step_end(self, args, state, control, **kwargs):",
              f"        control.should_training_stop = time.time() - {t0} > {budget}",
              "trainer.add_callback(OvernightBudget())"],
             f"after line {made}, where `trainer = Trainer(...)` ends (same indentation)"
             if made else "after the line that creates `trainer = Trainer(`"),
        Todo("print the summary block after the final evaluation",
             ["print('---')",
              f"print(f\"{name}: {{metrics['{metric.printed if metric else name}']:.6f}}\")",
              f"print(f\"training_seconds: {{{seconds}:.1f}}\")",
              "print(f'num_steps: {trainer.state.global_step}')"],
             f"after line {evaluated}, `metrics = trainer.evaluate()` (same indentation)"
             if evaluated else "after `metrics = trainer.evaluate()`")]


def lightning_todos(text: str, metric: Metric | None, t0: str, hydra: bool) -> list[Todo]:
    """Lightning: `max_time` stops `fit` at the budget; the block after `trainer.fit(...)`."""
    fit = _line_of(text, r"\btrainer\.fit\(")
    if not fit:
        return []
    lines = text.splitlines()
    start = next(i for i in range(fit, 0, -1) if "trainer.fit(" in lines[i - 1])
    pad = indent_of(lines, start)
    trained = free_name(text, "overnight_trained_s")
    printed = metric.printed if metric else "val/loss"
    name = metric.name if metric else "val_loss"
    budget = (Todo("stop `fit` when the budget is spent: Lightning's max_time, set from the "
                   "environment by a line of the args file (no code to change)",
                   ["++trainer.max_time=00:00:00:${oc.env:OVERNIGHT_BUDGET_S}",
                    "++trainer.min_epochs=0"],
                   "in overnight.args (adopt wrote it there)") if hydra else
              Todo("stop `fit` when the budget is spent: pass Lightning's max_time to Trainer",
                   ["max_time={'seconds': float(os.environ.get('OVERNIGHT_BUDGET_S', 1e9))},"],
                   "as an argument of `Trainer(`"))
    return [*imports_todo(text, ("time",) if hydra else ("os", "time")), budget,
            Todo("time the training", [f"{pad}{t0} = time.time()"],
                 f"before line {start}, `{lines[start - 1].strip()}`"),
            Todo("print the summary block once `fit` returns",
                 [f"{pad}{trained} = time.time() - {t0}", f"{pad}print('---')",
                  f"{pad}print(f\"{name}: {{float(trainer.callback_metrics['{printed}']):.6f}}\")",
                  f"{pad}print(f'training_seconds: {{{trained}:.1f}}')",
                  f"{pad}print(f'num_steps: {{trainer.global_step}}')"],
                 f"after line {fit}, where `trainer.fit(...)` ends")]


def seed_todos(text: str) -> list[Todo]:
    """Seeding from a constant: repeats are identical and say nothing about the noise."""
    if "OVERNIGHT_SEED" in text:
        return []
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name)
                and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
                in SEED_CALLS and node.args):
            arg = ast.get_source_segment(text, node.args[0]) or ""
            return [Todo(f"line {node.lineno} seeds with `{arg}`: use the run's seed so that "
                         "repeats measure the noise",
                         [f"int(os.environ.get('OVERNIGHT_SEED', 0)) + {arg}"
                          if not re.fullmatch(r"\d+", arg)
                          else f"int(os.environ.get('OVERNIGHT_SEED', {arg}))"],
                         f"in place of `{arg}` on line {node.lineno}")]
    return []
