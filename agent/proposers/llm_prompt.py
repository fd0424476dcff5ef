"""Prompts for the LLM proposer: program.md, the sweep's digest, the current best files and a
trimmed results table, asking for the JSON edit or for free text. Pure.

Token counts are estimated with the ratio the caller passes (agent.proposers.llm_budget learns
it from the server). The history budget is shared: the digest of what was learned
(agent.analysis.insights) takes up to DIGEST_SHARE of it, the results table (kept changes and
the most recent runs first) the rest. Categories whose share of the sweep is used up are
named, so the model proposes another kind of change.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.analysis.insights import render
from agent.analysis.insights_fold import digest
from agent.core.domain import Experiment, ExperimentStatus, Sweep
from agent.core.ports import ProposalContext
from agent.proposers.llm_budget import PRIOR_CHARS_PER_TOKEN
from agent.rules.categories import CATEGORY_VALUES, exhausted

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
{answer}"""

TEXT_ANSWER = """- Answer in this format and nothing else:

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

JSON_ANSWER = """- Answer with one JSON object and nothing else:

{"description": "<one short line saying what changes and why>",
 "category": "<one of: {categories}>",
 "edits": [{"path": "<the file>", "search": "<one existing line of the file, copied exactly>",
            "replace": "<the new text for that line>"}]}

Each edit replaces one line that exists in the file shown; use up to three edits for a
change that spans lines. The new text must differ from the old.
"""
ASK = {"text": "Propose the next experiment: one idea, as a DESCRIPTION line, a CATEGORY line "
               "and a diff.",
       "json": "Propose the next experiment: one idea, as the JSON object."}
REPAIR = {"text": "Reply with a DESCRIPTION line and the complete corrected change as one diff "
                  "against the current files shown above.",
          "json": "Reply with the JSON object whose edits make the complete corrected change "
                  "against the current files shown above."}
AGAIN = {"text": "Reply again in the required format: a DESCRIPTION line and one diff (or "
                 "SEARCH/REPLACE blocks) against the exact current file content.",
         "json": "Reply again with the JSON object; each search must be one line of the file "
                 "as shown."}


def _style(structured: bool) -> str:
    return "json" if structured else "text"


def system_prompt(structured: bool) -> str:
    answer = JSON_ANSWER if structured else TEXT_ANSWER
    return SYSTEM.replace("{answer}", answer).replace("{categories}", ", ".join(CATEGORY_VALUES))


def estimate_tokens(text: str, chars_per_token: float = PRIOR_CHARS_PER_TOKEN) -> int:
    return max(1, int(len(text) / chars_per_token) + 1)


def _fmt(value: float | None, sign: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.6f}" if sign else f"{value:.6f}"


def _row(exp: Experiment) -> str:
    crash = exp.crash_kind.value if exp.crash_kind else ""
    desc = " ".join(exp.description.split())[:120]
    return (f"| {exp.id} | {exp.status.value} | {crash} | {_fmt(exp.metric)} | "
            f"{_fmt(exp.delta, sign=True)} | {desc} |")


def history_table(sweep: Sweep, history: list[Experiment], budget_tokens: int,
                  chars_per_token: float = PRIOR_CHARS_PER_TOKEN) -> str:
    """Kept changes first (they make up the current best), then the newest others."""
    header = ["| id | status | crash | metric | delta | description |",
              "|---|---|---|---|---|---|"]
    kept = [e for e in reversed(history) if e.status is ExperimentStatus.KEPT]
    others = [e for e in reversed(history) if e.status is not ExperimentStatus.KEPT
              and e.status.is_finished()]
    rows: list[str] = []
    used = estimate_tokens("\n".join(header), chars_per_token)
    dropped = 0
    for exp in kept + others:
        row = _row(exp)
        cost = estimate_tokens(row, chars_per_token) + 1
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


def insights_block(ctx: ProposalContext, budget_tokens: int,
                   chars_per_token: float = PRIOR_CHARS_PER_TOKEN) -> str:
    """The sweep's digest (agent.analysis.insights) within budget_tokens (none at 0)."""
    if budget_tokens <= 0:
        return ""
    text = render(digest(ctx.sweep, ctx.history),
                  max_chars=int(budget_tokens * chars_per_token))
    return f"What this sweep has learned so far:\n<insights>\n{text}\n</insights>\n\n"


def categories_block(ctx: ProposalContext) -> str:
    """The categories whose share of the sweep is used up (empty when none is)."""
    shares = dict(ctx.sweep.config.category_shares)
    capped = exhausted(ctx.history, shares, ctx.sweep.max_experiments)
    if not capped:
        return ""
    lines = [f"- {c.value}: {why}" for c, why in capped.items()]
    return ("These categories have used up their share of the sweep; propose a different "
            "kind of change (answers in them are refused):\n" + "\n".join(lines) + "\n\n")


@dataclass(frozen=True)
class PromptStyle:
    """How a prompt is cut to fit: the answer asked for, the token ratio, program.md or not."""

    structured: bool = False  # the JSON edit (else the free-text formats)
    chars_per_token: float = PRIOR_CHARS_PER_TOKEN
    program: bool = True


def propose_prompt(ctx: ProposalContext, history_tokens: int,
                   style: PromptStyle = PromptStyle()) -> str:
    """The ask for one idea; history_tokens 0 gives the fixed part alone (for sizing)."""
    cpt = style.chars_per_token
    insights = insights_block(ctx, int(history_tokens * DIGEST_SHARE), cpt)
    table_tokens = max(history_tokens - estimate_tokens(insights, cpt), history_tokens // 4)
    program = _program(ctx) if style.program else ""
    return (f"{program}{_budget_line(ctx.sweep)}\n\n{insights}"
            f"{categories_block(ctx)}"
            f"{history_table(ctx.sweep, ctx.history, table_tokens, cpt)}\n\n"
            f"{_files_block(ctx.files)}\n\n{ASK[_style(style.structured)]}")


def log_tail(exp: Experiment, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join((exp.log_tail or "").splitlines()[-lines:]) or "(no output captured)"


def repair_prompt(ctx: ProposalContext, failed: Experiment, history_tokens: int,
                  style: PromptStyle = PromptStyle()) -> str:
    program = _program(ctx) if style.program else ""
    table = history_table(ctx.sweep, ctx.history, history_tokens // 2, style.chars_per_token)
    return (f"{program}Experiment {failed.id} ({failed.description!r}) crashed before "
            f"training: {failed.reason or 'unknown error'}.\n"
            "This looks like a simple bug (typo, missing import, wrong name or shape), not a "
            "bad idea. Fix it while keeping the same idea.\n\n"
            f"The diff that crashed (it is NOT applied to the files below):\n```diff\n"
            f"{failed.diff.rstrip()}\n```\n\nLast lines of its log:\n```\n{log_tail(failed)}\n"
            f"```\n\n{table}\n\n{_files_block(ctx.files)}\n\n"
            f"{REPAIR[_style(style.structured)]}")


def feedback_prompt(error: str, structured: bool = False) -> str:
    """The re-ask after an unusable answer: what was wrong and the format again."""
    return f"That answer could not be used: {error}\n{AGAIN[_style(structured)]}"
