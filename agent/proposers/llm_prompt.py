"""Prompts for the LLM proposer: program.md, the sweep's digest, the current best files and a
trimmed results table. Pure.

Token counts are estimated at four characters per token. The profile's history budget is
shared: the digest of what was learned (agent.analysis.insights) takes up to DIGEST_SHARE of it, the
results table (kept changes and the most recent runs first) the rest. Categories whose share
of the sweep is used up are named, so the model proposes another kind of change.
"""

from __future__ import annotations

from agent.analysis.insights import render
from agent.analysis.insights_fold import digest
from agent.core.domain import Experiment, ExperimentStatus, Sweep
from agent.core.ports import ProposalContext
from agent.rules.categories import CATEGORY_VALUES, exhausted

CHARS_PER_TOKEN = 4
LOG_TAIL_LINES = 50
DIGEST_SHARE = 0.5  # of the history budget

SYSTEM = """You are an ML research engineer running an autonomous experiment loop.
Each experiment changes the training script once and runs under a fixed wall-clock budget;
a change is kept only if the metric improves, otherwise it is reset.

Rules:
- Exactly ONE idea per proposal. Small, self-contained, easy to revert.
- Do not repeat an experiment from the results table.
- Edit only the editable file(s) shown; never the evaluation harness.
- Use what has been learned: avoid crash regions, do not re-run dead directions, and on a
  plateau try another knob or area, a bigger step, or two near-misses together.
- Answer in this format and nothing else:

DESCRIPTION: <one short line saying what changes and why>
CATEGORY: <one of: {categories}>
```diff
--- a/<path>
+++ b/<path>
@@ -<line>,<count> +<line>,<count> @@
 <context line>
-<old line>
+<new line>
 <context line>
```

The diff must apply to the exact file content shown. Instead of a diff you may use
SEARCH/REPLACE blocks (the path on the line above each block; SEARCH copied verbatim):

<path>
<<<<<<< SEARCH
<exact existing lines>
=======
<replacement lines>
>>>>>>> REPLACE
"""


SYSTEM = SYSTEM.replace("{categories}", ", ".join(CATEGORY_VALUES))


def estimate_tokens(text: str) -> int:
    return max(1, len(text) // CHARS_PER_TOKEN)


def _fmt(value: float | None, sign: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.6f}" if sign else f"{value:.6f}"


def _row(exp: Experiment) -> str:
    crash = exp.crash_kind.value if exp.crash_kind else ""
    desc = " ".join(exp.description.split())[:120]
    return (f"| {exp.id} | {exp.status.value} | {crash} | {_fmt(exp.metric)} | "
            f"{_fmt(exp.delta, sign=True)} | {desc} |")


def history_table(sweep: Sweep, history: list[Experiment], budget_tokens: int) -> str:
    """Kept changes first (they make up the current best), then the newest others."""
    header = ["| id | status | crash | metric | delta | description |",
              "|---|---|---|---|---|---|"]
    kept = [e for e in reversed(history) if e.status is ExperimentStatus.KEPT]
    others = [e for e in reversed(history) if e.status is not ExperimentStatus.KEPT
              and e.status.is_finished()]
    rows: list[str] = []
    used = estimate_tokens("\n".join(header))
    dropped = 0
    for exp in kept + others:
        row = _row(exp)
        cost = estimate_tokens(row) + 1
        if used + cost > budget_tokens:
            dropped += 1
            continue
        rows.append(row)
        used += cost
    lines = [f"Metric: {sweep.metric} ({sweep.direction.value}); baseline "
             f"{_fmt(sweep.baseline_metric)}, current best {_fmt(sweep.best_metric)}.",
             "Kept changes first, then the most recent experiments (newest first):", *header,
             *rows]
    if dropped:
        lines.append(f"({dropped} older experiments not shown)")
    return "\n".join(lines)


def _files_block(files: dict[str, str]) -> str:
    parts = []
    for path, text in sorted(files.items()):
        parts.append(f"{path} (current best, editable):\n```python\n{text.rstrip()}\n```")
    return "\n\n".join(parts)


def _program(ctx: ProposalContext) -> str:
    text = ctx.program.strip()
    return f"The target's program.md:\n<program>\n{text}\n</program>\n\n" if text else ""


def _budget_line(sweep: Sweep) -> str:
    return (f"Each run trains for {sweep.budget_s:g} s of wall clock (hard limit "
            f"{sweep.timeout_s:g} s); a faster change that sees more data can win.")


def insights_block(ctx: ProposalContext, budget_tokens: int) -> str:
    """The sweep's digest (agent.analysis.insights) within budget_tokens."""
    text = render(digest(ctx.sweep, ctx.history), max_chars=budget_tokens * CHARS_PER_TOKEN)
    return f"What this sweep has learned so far:\n<insights>\n{text}\n</insights>"


def categories_block(ctx: ProposalContext) -> str:
    """The categories whose share of the sweep is used up (empty when none is)."""
    shares = dict(ctx.sweep.config.category_shares)
    capped = exhausted(ctx.history, shares, ctx.sweep.max_experiments)
    if not capped:
        return ""
    lines = [f"- {c.value}: {why}" for c, why in capped.items()]
    return ("These categories have used up their share of the sweep; propose a different "
            "kind of change (answers in them are refused):\n" + "\n".join(lines) + "\n\n")


def propose_prompt(ctx: ProposalContext, history_tokens: int) -> str:
    insights = insights_block(ctx, int(history_tokens * DIGEST_SHARE))
    table_tokens = max(history_tokens - estimate_tokens(insights), history_tokens // 4)
    return (f"{_program(ctx)}{_budget_line(ctx.sweep)}\n\n{insights}\n\n"
            f"{categories_block(ctx)}"
            f"{history_table(ctx.sweep, ctx.history, table_tokens)}\n\n"
            f"{_files_block(ctx.files)}\n\n"
            "Propose the next experiment: one idea, as a DESCRIPTION line, a CATEGORY line "
            "and a diff.")


def log_tail(exp: Experiment, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join((exp.log_tail or "").splitlines()[-lines:]) or "(no output captured)"


def repair_prompt(ctx: ProposalContext, failed: Experiment, history_tokens: int) -> str:
    return (f"{_program(ctx)}Experiment {failed.id} ({failed.description!r}) crashed before "
            f"training: {failed.reason or 'unknown error'}.\n"
            "This looks like a simple bug (typo, missing import, wrong name or shape), not a "
            "bad idea. Fix it while keeping the same idea.\n\n"
            f"The diff that crashed (it is NOT applied to the files below):\n```diff\n"
            f"{failed.diff.rstrip()}\n```\n\nLast lines of its log:\n```\n{log_tail(failed)}\n"
            f"```\n\n{history_table(ctx.sweep, ctx.history, history_tokens // 2)}\n\n"
            f"{_files_block(ctx.files)}\n\n"
            "Reply with a DESCRIPTION line and the complete corrected change as one diff "
            "against the current files shown above.")


def feedback_prompt(error: str) -> str:
    return (f"That answer could not be used: {error}\n"
            "Reply again in the required format: a DESCRIPTION line and one diff (or "
            "SEARCH/REPLACE blocks) against the exact current file content.")
