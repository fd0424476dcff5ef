"""What a training script lacks of the contract, as lines to add and where, and the progress
regex that fits what it printed. Pure, over the files' text.

Finds the metric the script prints (`val loss 1.2`, `val_loss: 1.2`, `val_loss=1.2`, a dict key
`"eval_loss"`, Lightning's `self.log("val/acc", ...)`) and the expression holding its value, the
training loop (the outermost `for`/`while` with a `.backward(`/`.step(` in it), its step
counter, the seeding calls, and then says: where to read the budget (names that do not collide
with the script's own), where to stop, the final evaluation when the metric is only computed
inside the loop, the summary block (metric, training_seconds, num_steps), and the seed.
Scripts driven by a trainer object (Hugging Face `Trainer`, Lightning) get that trainer's way.

A training loop in a library module of the repository (minGPT's shape:
`projects/chargpt/chargpt.py` builds a `Trainer` from `mingpt/trainer.py` and calls
`trainer.run()`, whose `while True:` is the training loop): the budget is read and kept in the
library (before its loop, and a `break` as the loop body's last statement, with the imports
that file lacks), and a method notes its training time on its object as the loop ends
(`self.overnight_trained_s`; a plain function is timed around its call in the script instead);
after the call that runs the loop, the script evaluates once more when it computes the metric
only in a callback, and prints the summary block (the training time and the step counter read
from the trainer object, e.g. `trainer.iter_num`).

The progress regex: the lines with a training loss (`loss` and a number) are tried, in order,
against the default progress format (`step 120 | loss 3.41 | elapsed 31.2s`: no regex needed),
the formats of well-known scripts, and regexes made from such lines themselves: a line's step
counter (`iter 10`, `step 10`, `batch 10`) and its loss, the literal text between them kept. The
one that parses the most of those lines wins (the default format on a tie), and only when it
parses at least half of them.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from runner.summary import SUMMARY_SEPARATOR, parse_custom_progress, parse_progress

# --- the script's own training loop -----------------------------------------------------------
_KIND = (r"(?:loss|ppl|perplexity|bpb|bpc|nll|r?mse|mae|wer|cer|acc\w*|error|f1|score|bleu|"
         r"rouge\w*|auc|auroc|m?iou|dice|top[15])")
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
    """Seeding from a constant: repeats are identical and say nothing about the noise. The
    global seeds (`torch.manual_seed(seed)`, `random.seed`, `set_seed`) are the ones to vary,
    each of them, before a dedicated generator's (`torch.Generator().manual_seed(1234)`, often
    the fixed data split, which repeats should share; then the first)."""
    if "OVERNIGHT_SEED" in text:
        return []
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    calls = sorted((node for node in ast.walk(tree)
                    if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute | ast.Name)
                    and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
                    in SEED_CALLS and node.args),
                   key=lambda n: (not _global_seed(n), n.lineno, n.col_offset))
    chosen = [n for n in calls if _global_seed(n)] or calls[:1]
    todos = []
    for node in chosen:
        arg = ast.get_source_segment(text, node.args[0]) or ""
        todos.append(Todo(f"line {node.lineno} seeds with `{arg}`: use the run's seed so that "
                          "repeats measure the noise",
                          [f"int(os.environ.get('OVERNIGHT_SEED', 0)) + {arg}"
                           if not re.fullmatch(r"\d+", arg)
                           else f"int(os.environ.get('OVERNIGHT_SEED', {arg}))"],
                          f"in place of `{arg}` on line {node.lineno}"))
    return todos


def _global_seed(call: ast.Call) -> bool:
    """`set_seed(…)`, or a seed function of a module (`torch.manual_seed`, `np.random.seed`,
    `torch.cuda.manual_seed_all`), not of an object made on the spot (`torch.Generator()`)."""
    func: ast.expr = call.func
    while isinstance(func, ast.Attribute):
        func = func.value
    return isinstance(func, ast.Name)


# --- a training loop in a library module ------------------------------------------------------
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


# --- the progress regex that fits the printed lines -------------------------------------------
# Progress formats of well-known scripts: (a marker in the script's code, its progress_regex).
PROGRESS_FORMATS = (
    (r"iter \{\w+\}: loss", r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)"),  # nanoGPT
    (r"\bTrainer\(", r"\{'loss': '?(?P<loss>[\d.]+)'?"),  # Hugging Face Trainer's dict lines
    # Lightning's bars (tqdm: `train/loss=0.51`, rich: `train/loss: 0.51`) and tqdm postfixes
    (r"lightning|set_postfix|tqdm",
     r".*(?<![\d/])(?P<step>\d+)/\d+ .*?(?<![\w/])(?:train[/_])?loss[=:]\s*(?P<loss>[\d.]+)"),
    (r"\| epoch", r"(?P<step>\d+)/\s*\d+ batches .*loss\s+(?P<loss>[\d.]+)"),
    (r"Train Epoch:", r"Train Epoch: \d+ \[(?P<step>\d+)/\d+.*Loss: (?P<loss>[\d.]+)"),
)
NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_LOSS = re.compile(rf"(?<![\w.])(?:\w+[ _/])?loss\b[\s:=]{{0,3}}({NUMBER}|nan|inf)(?![\w.])",
                   re.IGNORECASE)
_STEP = re.compile(r"(?<![\w.])(step|iter|iteration|it|batch)\b[\s:=#]{0,3}(\d+)(?![\d.]|ms)",
                   re.IGNORECASE)
_ANY_NUMBER = re.compile(NUMBER)


@dataclass(frozen=True)
class ProgressFit:
    """How a script's progress lines can be read: `regex` None with `default` True needs no
    progress_regex; None and not default: nothing fits (or no line has a loss)."""

    regex: str | None
    default: bool
    matched: int  # loss lines parsed
    lines: int  # loss lines printed
    example: str = ""


def loss_lines(lines: list[str]) -> list[str]:
    """The printed lines with a training loss and a number, before any `---` summary block."""
    found = []
    for line in lines:
        if line.strip() == SUMMARY_SEPARATOR:
            break
        if _LOSS.search(line) and not re.match(r"\s*(val|valid|test|eval)", line, re.I):
            found.append(line.rstrip("\n"))
    return found


def _parsed(lines: list[str], pattern: re.Pattern[str]) -> list[str]:
    return [line for line in lines if parse_custom_progress(line, pattern) is not None]


def made_from(line: str) -> str | None:
    """A regex made from one line: its step counter and its loss, the text between them kept."""
    loss = _LOSS.search(line)
    if loss is None:
        return None
    step = _STEP.search(line)
    parts = [(loss.start(1), loss.end(1), f"(?P<loss>{NUMBER})")]
    if step is not None:
        parts.append((step.start(2), step.end(2), r"(?P<step>\d+)"))
    start = min(loss.start(), step.start() if step else loss.start())
    out, at = [], start
    for begin, end, group in sorted(parts):
        out.append(_literal(line[at:begin]))
        out.append(group)
        at = end
    return "".join(out)


def _literal(text: str) -> str:
    """Text between the groups: numbers become NUMBER, runs of spaces `\\s+`, the rest escaped."""
    out, at = [], 0
    for m in _ANY_NUMBER.finditer(text):
        out.append(re.escape(text[at:m.start()]))
        out.append(f"(?:{NUMBER})")
        at = m.end()
    out.append(re.escape(text[at:]))
    return re.sub(r"(?:\\ )+", r"\\s+", "".join(out))


def fit_progress(lines: list[str]) -> ProgressFit:
    """The best way to read these printed lines' losses (see the module docstring)."""
    losses = loss_lines(lines)
    if not losses:
        return ProgressFit(None, False, 0, 0)
    need = max(1, (len(losses) + 1) // 2)
    default = [line for line in losses if parse_progress(line) is not None]
    made = {rx for line in losses[:20] if (rx := made_from(line)) is not None}
    best: tuple[int, str, list[str]] | None = None
    for rx in [*(rx for _, rx in PROGRESS_FORMATS), *sorted(made)]:
        hits = _parsed(losses, re.compile(rx))
        if hits and (best is None or len(hits) > best[0]):
            best = (len(hits), rx, hits)
    if len(default) >= need and (best is None or len(default) >= best[0]):
        return ProgressFit(None, True, len(default), len(losses), default[0])
    if best is not None and best[0] >= need:
        return ProgressFit(best[1], False, best[0], len(losses), best[2][0])
    return ProgressFit(None, False, 0, len(losses), losses[0])
