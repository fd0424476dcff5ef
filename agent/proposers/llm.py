"""The `llm:<profile>` proposer: ask a chat model for one change; validate; repair trivial crashes.

Each ask is fitted to the model's context (the profile's `context_tokens`, else what the
server says, else what a length refusal names; the token budget in agent.proposers.llm_backends)
and to the sweep's caps, so a call never asks for more than either leaves. The answer is asked
for as a JSON edit where the server takes a schema (the wire formats in
agent.proposers.llm_backends; "auto" falls back format by format to free text), parsed, checked
with the same pure admission rules as any external proposal plus a duplicate check, and
re-asked with only the last unusable answer and what was wrong with it, at most
`answer_retries` times. A prompt the context refuses is shrunk and asked again. An answer that
stays unusable, a timeout (never retried) or a server that stays down yields a proposal marked
`unusable` with the model's own fault as the reason, so the loop records it `rejected` and asks
again. Only a fatal error (a bad key, an unknown model), files too large for the context or a
cap ends the sweep (propose returns None, `out_of_ideas` says why). Every answer, error and
token is kept (Conversation).

The prompt (pure): program.md, the sweep's digest, the current best files and a trimmed results
table, asking for the JSON edit or for free text. Token counts are estimated with the ratio the
caller passes (the TokenMeter learns it from the server). The history budget is shared: the
digest of what was learned (agent.analysis.insights) takes up to DIGEST_SHARE of it, the results
table (kept changes and the most recent runs first) the rest. Categories whose share of the
sweep is used up are named, so the model proposes another kind of change.

The answer (pure) becomes one description and a clean unified diff. Accepted shapes, tried in
this order: the JSON edit, SEARCH/REPLACE blocks, a unified diff (fenced or bare; hunks are
re-anchored by their content, so wrong line numbers are forgiven), a full file in a fenced
block — only when it is plausibly the whole file (it keeps WHOLE_FILE_KEEPS of the file's
lines; a fragment is refused, labelled or not). Whatever the shape, the result is applied to
the current files in memory and re-emitted with difflib, so the diff always matches the files
the model was shown. It is then checked as a proposal: the pure admission rules, the duplicate
check over the sweep's history and the category caps. Every failure raises AdmissionError with
a message meant for the model.

The record: every answer of a conversation is kept (each clipped to ANSWER_CHARS, at most
MAX_TURNS turns) with what was asked, the format, the tokens, the seconds and what was wrong
with it, in `meta["llm_conversation"]`; the totals in `meta["llm_usage"]` are what the sweep's
caps count. A failed call (a timeout, a prompt the context refused) is a turn too: its tokens
count.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

from agent.analysis.insights import render
from agent.analysis.insights_fold import digest
from agent.analysis.trials import constant_changes
from agent.core.config import TargetConfig
from agent.core.diff import files_diff, lines_with_ends, loose_hunks, split_lines
from agent.core.diff import normalize as normalize_diff
from agent.core.domain import Experiment, ExperimentStatus, Proposal, Sweep
from agent.core.errors import AdmissionError
from agent.core.ports import ProposalContext
from agent.proposers.llm_backends import (
    ANTHROPIC_AUTO,
    OPENAI_AUTO,
    OUTPUT_FLOOR_TOKENS,
    PRIOR_CHARS_PER_TOKEN,
    ChatBackend,
    ChatReply,
    ChatRequest,
    ContextFull,
    LLMError,
    LLMProfile,
    TokenMeter,
    apply_edits,
    context_in_error,
    edit_schema,
    history_budget,
    json_answer,
    load_profile,
    make_backend,
    margin,
    output_budget,
)
from agent.rules.admit import check_proposal
from agent.rules.categories import (
    CATEGORY_VALUES,
    Category,
    category_of_knob,
    category_of_text,
    exhausted,
    parse_category,
)

# --- the prompts ------------------------------------------------------------------------------
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
    n = exp.record.n if exp.record is not None else 0
    return (f"| {exp.id} | {exp.status.value} | {crash} | {_fmt(exp.metric)} | {n} | "
            f"{_fmt(exp.delta, sign=True)} | {desc} |")


def history_table(sweep: Sweep, history: list[Experiment], budget_tokens: int,
                  chars_per_token: float = PRIOR_CHARS_PER_TOKEN) -> str:
    """Kept changes first (they make up the current best), then the newest others."""
    header = ["| id | status | crash | metric (mean of its runs) | runs | delta (vs the "
              "incumbent runs it was compared with) | description |",
              "|---|---|---|---|---|---|---|"]
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
             *weighed_besides(sweep.config),
             "Kept changes first, then the most recent experiments (newest first):", *header,
             *rows]
    if dropped:
        lines.append(f"({dropped} older experiments not shown)")
    return "\n".join(lines)


def weighed_besides(config: TargetConfig) -> list[str]:
    """What a keep weighs besides the metric (docs/keep-rule.md#constraints-and-simplicity), as
    the prompt tells the model: simpler is better, and the bounds a change must stay within."""
    out = []
    if config.simplicity_margin > 0:
        out.append(f"Simpler is better: a change that removes lines is kept unless worse by more "
                   f"than {config.simplicity_margin:g}; one that adds code should gain at least "
                   "that.")
    if config.constraints:
        out.append("Bounds on the summary (a change past a hard one is discarded whatever its "
                   "metric; a soft one asks more gain): " + "; ".join(
                       f"{b.key} {b.text}" for b in config.constraints) + ".")
    return out


def _files_block(files: dict[str, str]) -> str:
    parts = []
    for path, text in sorted(files.items()):
        parts.append(f"{path} (current best, editable):\n```python\n{text.rstrip()}\n```")
    return "\n\n".join(parts)


def _program(ctx: ProposalContext) -> str:
    text = ctx.program.strip()
    return f"The target's program.md:\n<program>\n{text}\n</program>\n\n" if text else ""


def _budget_line(sweep: Sweep) -> str:
    if sweep.config.budget is not None:
        return (f"Each run trains {sweep.config.budget} (hard limit {sweep.timeout_s:g} s of "
                "wall clock); a faster change gains nothing but time.")
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


# --- the answer: one description and a clean diff ---------------------------------------------
_DESC = re.compile(r"^\W{0,4}description\W{0,4}\s*[:\-]\s*(.+)$", re.I | re.M)
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
_SR = re.compile(r"^<{5,9} ?SEARCH[ \t]*\n(.*?)^={5,9}[ \t]*\n(.*?)^>{5,9} ?REPLACE[ \t]*$",
                 re.S | re.M)
_DIFF_START = re.compile(r"^(diff --git |--- )", re.M)
WHOLE_FILE_KEEPS = 0.75  # of the file's lines a whole-file answer must keep unchanged


@dataclass(frozen=True)
class ParsedAnswer:
    description: str
    diff: str  # clean unified diff against the files shown
    shape: str  # "json_edit" | "search_replace" | "unified_diff" | "full_file"
    category: str | None = None  # as the JSON answer stated it


def description_of(text: str) -> str | None:
    m = _DESC.search(text)
    if m:
        return _clean(m.group(1))
    outside = _FENCE.sub("", text)
    for line in outside.splitlines():
        line = _clean(line)
        if line and not line.startswith(("<<<", "===", ">>>", "---", "+++", "@@")):
            return line
    return None


def _clean(line: str) -> str:
    return " ".join(line.strip().strip("*#`>_ ").split())[:200]


def _path_for(label: str, files: dict[str, str]) -> str | None:
    """An editable path named in a label line ("train.py", "FILE: `train.py`", "### train.py")."""
    words = re.findall(r"[\w./-]+", label)
    for word in reversed(words):
        word = word.removeprefix("a/").removeprefix("b/")
        if word in files:
            return str(word)
    return None


# --- search/replace -------------------------------------------------------------------------
def _replace_once(content: str, search: str, replace: str, path: str) -> str:
    if not search.strip():
        raise AdmissionError("bad_search", f"an empty SEARCH section for {path}: copy the exact "
                             "lines to change into SEARCH")
    count = content.count(search)
    if count == 1:
        return content.replace(search, replace, 1)
    if count > 1:
        raise AdmissionError("bad_search", f"the SEARCH text matches {count} places in {path}; "
                             "include more surrounding lines so it is unique")
    # Forgive trailing-whitespace differences, line by line.
    lines = lines_with_ends(content)
    want = [s.rstrip() for s in split_lines(search)]
    hits = [i for i in range(len(lines) - len(want) + 1)
            if [x.rstrip() for x in lines[i:i + len(want)]] == want]
    if len(hits) != 1:
        first = search.strip().splitlines()[0][:80]
        raise AdmissionError("bad_search", f"the SEARCH text starting {first!r} was not found "
                             f"exactly in {path}; copy the lines verbatim from the file shown")
    i = hits[0]
    new = replace if replace.endswith("\n") or not replace else replace + "\n"
    return "".join(lines[:i]) + new + "".join(lines[i + len(want):])


def apply_search_replace(text: str, files: dict[str, str]) -> dict[str, str]:
    out = dict(files)
    for m in _SR.finditer(text):
        before = text[:m.start()].rstrip("\n").splitlines()
        label = next((ln for ln in reversed(before) if ln.strip() and not ln.startswith("```")), "")
        path = _path_for(label, files) or (next(iter(files)) if len(files) == 1 else None)
        if path is None:
            raise AdmissionError("bad_search", "put the file's path on the line just above "
                                 f"<<<<<<< SEARCH (editable: {', '.join(sorted(files))})")
        out[path] = _replace_once(out[path], m.group(1), m.group(2), path)
    return out


# --- unified diff ---------------------------------------------------------------------------
def extract_diff_text(text: str) -> str | None:
    for m in _FENCE.finditer(text):
        if _DIFF_START.search(m.group(2)) and "\n+++ " in "\n" + m.group(2):
            return m.group(2)
    start = _DIFF_START.search(text)
    return text[start.start():] if start and "\n+++ " in text[start.start():] else None


def _apply_hunk(content: str, line_no: int, body: list[str], path: str) -> str:
    old = [b[1:] for b in body if b[:1] in (" ", "-") or b == ""]
    new = [b[1:] for b in body if b[:1] in (" ", "+") or b == ""]
    while old and new and old[-1] == "" and new[-1] == "" and body and body[-1] == "":
        old.pop(), new.pop(), body.pop()  # a blank line the model left after the hunk
    lines = split_lines(content)
    if not old:
        at = max(0, min(line_no, len(lines)))
        return "\n".join(lines[:at] + new + lines[at:]) + "\n"
    norm = [x.rstrip() for x in old]
    hits = [i for i in range(len(lines) - len(old) + 1)
            if [x.rstrip() for x in lines[i:i + len(old)]] == norm]
    if not hits:
        first = next((x for x in old if x.strip()), old[0])[:80]
        raise AdmissionError("does_not_apply", f"a hunk of the diff for {path} does not match the "
                             f"file (context starting {first!r} not found): diff against the "
                             "exact current file shown")
    at = min(hits, key=lambda i: abs(i + 1 - line_no))
    return "\n".join(lines[:at] + new + lines[at + len(old):]) + "\n"


def apply_unified_diff(diff: str, files: dict[str, str]) -> dict[str, str]:
    hunks = loose_hunks(diff)
    if not hunks:
        raise AdmissionError("malformed_diff", "the diff has no '--- a/file', '+++ b/file' and "
                             "'@@' hunk lines")
    out = dict(files)
    for path, line_no, body in hunks:
        if path not in out:
            raise AdmissionError("not_editable", f"{path} is not editable (editable files: "
                                 f"{', '.join(sorted(files))})")
        out[path] = _apply_hunk(out[path], line_no, body, path)
    return out


# --- full file ------------------------------------------------------------------------------
def _kept_lines(body: str, original: str) -> int:
    old, new = split_lines(original), split_lines(body)
    return sum(b.size for b in SequenceMatcher(None, old, new, autojunk=False)
               .get_matching_blocks())


def _whole_file(body: str, original: str, path: str) -> None:
    """Refuse a block that is not plausibly the whole file with one change."""
    total = len(split_lines(original))
    kept = _kept_lines(body, original)
    if kept < WHOLE_FILE_KEEPS * total:
        raise AdmissionError("not_whole_file", f"the code block for {path} keeps only {kept} "
                             f"of the file's {total} lines, so it is not the whole file: send "
                             "the change as a diff or SEARCH/REPLACE, not a fragment")


def full_file(text: str, files: dict[str, str]) -> dict[str, str] | None:
    out = dict(files)
    found = False
    for m in _FENCE.finditer(text):
        info, body = m.group(1).strip(), m.group(2)
        before = text[:m.start()].rstrip("\n").splitlines()
        label = before[-1] if before else ""
        path = _path_for(info, files) or _path_for(label, files)
        if path is None and len(files) == 1:
            path = next(iter(files))
        if path is not None:
            _whole_file(body, files[path], path)
            out[path], found = body, True
    return out if found else None


def parse_answer(text: str, files: dict[str, str]) -> ParsedAnswer:
    """One description + clean diff from a model answer. Raises AdmissionError."""
    data = json_answer(text)
    if data is not None:
        edited = files_diff(files, apply_edits(data, files))
        if not edited:
            raise AdmissionError("empty_diff", "the edits leave the files exactly as they are: "
                                 "'replace' must differ from 'search'")
        stated = data.get("description")
        description = _clean(stated) if isinstance(stated, str) and _clean(stated) else (
            "change proposed by the LLM")
        category = data.get("category")
        return ParsedAnswer(description, edited, "json_edit",
                            category if isinstance(category, str) else None)
    if _SR.search(text):
        after, shape = apply_search_replace(text, files), "search_replace"
    elif (diff := extract_diff_text(text)) is not None:
        after, shape = apply_unified_diff(diff, files), "unified_diff"
    elif (whole := full_file(text, files)) is not None:
        after, shape = whole, "full_file"
    else:
        raise AdmissionError("no_diff", "no change found in the answer: reply with a "
                             "DESCRIPTION: line and a unified diff in a ```diff block (or "
                             "SEARCH/REPLACE blocks)")
    diff = files_diff(files, after)
    if not diff:
        raise AdmissionError("empty_diff", "the change leaves the files exactly as they are")
    description = description_of(text) or "change proposed by the LLM"
    return ParsedAnswer(description=description, diff=diff, shape=shape)


# --- the answer checked as a proposal ---------------------------------------------------------
_CATEGORY = re.compile(r"^\W*CATEGORY\W*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)


def category_of_answer(raw: str, description: str, diff: str, stated: str | None = None
                       ) -> Category:
    """The category the model stated, else one guessed from the constants or the words."""
    m = _CATEGORY.search(raw)
    said = parse_category(stated) if stated else None
    said = said or (parse_category(m.group(1).strip("*`_ ")) if m else None)
    if said is not None:
        return said
    changes, _ = constant_changes(diff)
    return category_of_knob(changes[0].name) if changes else category_of_text(description)


@dataclass(frozen=True)
class ValidAnswer:
    description: str
    diff: str
    shape: str
    category: Category


def validate(ctx: ProposalContext, raw: str, fallback: str | None, finish: str = "",
             tokens_out: int = 0) -> ValidAnswer:
    """The usable proposal in `raw` (fallback: a repair's description). Raises AdmissionError."""
    try:
        parsed = parse_answer(raw, ctx.files)
    except AdmissionError as exc:
        if finish in ("length", "max_tokens"):
            raise AdmissionError("cut_off", f"the answer was cut off at {tokens_out} "
                                 f"tokens before it was complete ({exc.message}); give a "
                                 "shorter answer") from None
        raise
    description = parsed.description
    if fallback and description == "change proposed by the LLM":
        description = fallback
    check_proposal(Proposal(description, parsed.diff), ctx.sweep.config)
    key = normalize_diff(parsed.diff)
    for exp in ctx.history:
        if exp.diff and exp.status is not ExperimentStatus.REJECTED and \
                normalize_diff(exp.diff) == key:
            raise AdmissionError("duplicate", f"this exact change was already tried as "
                                 f"experiment {exp.id} ({exp.status.value}): "
                                 f"{exp.description}; propose a different idea")
    category = category_of_answer(raw, description, parsed.diff, parsed.category)
    capped = exhausted(ctx.history, dict(ctx.sweep.config.category_shares),
                       ctx.sweep.max_experiments)
    if category in capped and fallback is None:  # a repair keeps its idea's category
        raise AdmissionError("category_exhausted", f"the {category.value} category has used "
                             f"its share of this sweep ({capped[category]}); propose a "
                             "different kind of change")
    return ValidAnswer(description, parsed.diff, parsed.shape, category)


def salvage(raw: str, fallback: str | None) -> tuple[str, str] | None:
    """For the rejected record: the answer's own diff text, if it had one."""
    diff = extract_diff_text(raw)
    return (description_of(raw) or fallback or "unusable LLM answer", diff) if diff else None


# --- the record: what one conversation spent and said -----------------------------------------
USAGE_KEY = "llm_usage"
CONVERSATION_KEY = "llm_conversation"  # agent.analysis.projection shows it as `llm`
ANSWER_CHARS = 4000
MAX_TURNS = 12


@dataclass
class Usage:
    tokens_in: int = 0
    tokens_out: int = 0
    usd: float = 0.0
    calls: int = 0
    http_retries: int = 0
    estimated: bool = False  # some counts are estimates (a timed-out call, a silent server)

    def as_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"tokens_in": self.tokens_in, "tokens_out": self.tokens_out,
                                "usd": round(self.usd, 6), "calls": self.calls,
                                "http_retries": self.http_retries}
        if self.estimated:
            meta["estimated"] = True
        return meta


@dataclass
class Conversation:
    """The turns of one ask (a proposal or a repair) and what they cost."""

    usage: Usage = field(default_factory=Usage)
    turns: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # "code: message", one per unusable turn

    @property
    def answers(self) -> int:
        return sum(1 for t in self.turns if "answer" in t)

    def spend(self, tokens_in: int, tokens_out: int, usd: float, retries: int = 0,
              estimated: bool = False) -> None:
        u = self.usage
        u.tokens_in += tokens_in
        u.tokens_out += tokens_out
        u.usd += usd
        u.calls += 1
        u.http_retries += retries
        u.estimated = u.estimated or estimated

    def turn(self, asked: str, **facts: Any) -> dict[str, Any]:
        """Record one turn; `answer` is clipped. Returns it (an error may be added later)."""
        entry: dict[str, Any] = {"asked": asked[:300]}
        for key, value in facts.items():
            if value is not None:
                entry[key] = value[:ANSWER_CHARS] if key == "answer" else value
        if len(self.turns) < MAX_TURNS:
            self.turns.append(entry)
        return entry

    def fail(self, entry: dict[str, Any], code: str, message: str) -> None:
        entry["error"] = f"{code}: {message}"
        self.errors.append(entry["error"])

    def as_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {USAGE_KEY: self.usage.as_meta(), CONVERSATION_KEY: self.turns}
        if self.errors:
            meta["llm_errors"] = self.errors
        return meta


# --- the proposer -----------------------------------------------------------------------------
logger = logging.getLogger(__name__)
RAW_ANSWER_CHARS = 20_000
MAX_SHRINKS = 2  # re-asks after the context refused a prompt, per conversation
CAP_SLACK = 0.05  # of a prompt's estimate, kept below a cap for the estimate's error
_UNKNOWN = object()
Build = Callable[[int, PromptStyle], str]


class _Stop(Exception):  # noqa: N818  (control flow inside _converse only)
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class LLMProposer:
    def __init__(self, profile: LLMProfile, backend: ChatBackend, *, seed: int = 42,
                 store: Any = None) -> None:
        self.profile, self.backend, self.seed = profile, backend, seed
        self.name = f"llm:{profile.name}"
        self.out_of_ideas: str | None = None
        self.store = store  # records usage that no proposal carries (a failed conversation)
        self.meter = TokenMeter()
        self._counted = False  # the server's tokenizer was asked
        self._context: Any = profile.context_tokens or _UNKNOWN
        auto = ANTHROPIC_AUTO if profile.backend == "anthropic" else OPENAI_AUTO
        self.formats = list(auto if profile.answer_format == "auto" else
                            (profile.answer_format,))

    # --- what the model can take ----------------------------------------------------------
    @property
    def context(self) -> int | None:
        if self._context is _UNKNOWN:
            self._context = self.backend.context_tokens()
            logger.info("%s: context %s", self.name, self._context or "unknown")
        return self._context  # type: ignore[no-any-return]

    @property
    def answer_format(self) -> str:
        return self.formats[0]

    def _cap_room(self, ctx: ProposalContext, spent: Conversation, prompt_tokens: int
                  ) -> tuple[int | None, str | None]:
        """The output tokens the caps leave for a call of prompt_tokens (None: no cap), or
        why no call fits."""
        p, u = self.profile, spent.usage
        tokens, usd = ctx.llm_tokens + u.tokens_in + u.tokens_out, ctx.llm_usd + u.usd
        prompt_tokens = int(prompt_tokens * (1 + CAP_SLACK)) + 16  # the estimate's error
        room: int | None = None
        if p.max_llm_tokens is not None:
            room = p.max_llm_tokens - tokens - prompt_tokens
            if room < min(OUTPUT_FLOOR_TOKENS, p.max_output_tokens):
                return None, (f"LLM token cap reached: {tokens} spent and the next ask needs "
                              f"~{prompt_tokens} + {OUTPUT_FLOOR_TOKENS}; "
                              f"max_llm_tokens={p.max_llm_tokens}")
        if p.max_llm_usd is not None:
            left = p.max_llm_usd - usd - p.cost_usd(prompt_tokens, 0)
            per_out = p.usd_per_mtok_out / 1e6
            usd_room = int(left / per_out) if per_out else (10**9 if left > 0 else -1)
            if usd_room < min(OUTPUT_FLOOR_TOKENS, p.max_output_tokens):
                return None, (f"LLM spend cap reached: ${usd:.4f} spent and the next ask "
                              f"would pass max_llm_usd={p.max_llm_usd:g}")
            room = usd_room if room is None else min(room, usd_room)
        return room, None

    # --- Proposer protocol ----------------------------------------------------------------
    def propose(self, ctx: ProposalContext) -> Proposal | None:
        self.out_of_ideas = None
        return self._converse(ctx, lambda n, style: propose_prompt(ctx, n, style),
                              fallback_description=None)

    def repair(self, ctx: ProposalContext, failed: Experiment) -> Proposal | None:
        return self._converse(ctx, lambda n, style: repair_prompt(ctx, failed, n, style),
                              fallback_description=f"{failed.description} (fixed)",
                              repairs=failed.id)

    # --- one conversation -----------------------------------------------------------------
    def _converse(self, ctx: ProposalContext, build: Build, *, fallback_description: str | None,
                  repairs: int | None = None) -> Proposal | None:
        conv = Conversation()
        last_bad: tuple[str, str] | None = None  # the last unusable answer and what was wrong
        candidate: tuple[str, str] | None = None
        shrinks, verdict = 0, ""
        raw, valid = "", None
        while conv.answers < 1 + self.profile.answer_retries:
            try:
                request, asked = self._request(ctx, build, conv, last_bad)
            except _Stop as stop:
                if not conv.turns:
                    self._give_up(ctx, conv, stop.why)
                    return None
                verdict = f"{verdict}; not asked again: {stop.why}" if verdict else stop.why
                break
            try:
                reply = self.backend.complete(request)
            except LLMError as exc:
                outcome = self._failed_call(ctx, conv, request, asked, exc, shrinks)
                if outcome == "again":
                    shrinks += exc.kind == "length"
                    continue
                if outcome == "fatal":
                    self._give_up(ctx, conv, f"the language model failed: {exc}")
                    return None
                verdict = outcome
                break
            raw, entry = reply.text, self._answered(conv, request, asked, reply)
            try:
                valid = validate(ctx, raw, fallback_description, reply.finish, reply.tokens_out)
            except AdmissionError as exc:
                conv.fail(entry, exc.code, exc.message)
                candidate = candidate or salvage(raw, fallback_description)
                logger.info("%s: unusable answer (%s), answer %d", self.name, exc.code,
                            conv.answers)
                last_bad, verdict = (raw, exc.message), f"{exc.code}: {exc.message}"
                continue
            return self._proposal(valid, conv, raw, repairs)
        return self._unusable(conv, raw, candidate, fallback_description, verdict, repairs)

    def _request(self, ctx: ProposalContext, build: Build, conv: Conversation,
                 last_bad: tuple[str, str] | None) -> tuple[ChatRequest, str]:
        """The next call, fitted to the context and the caps. Raises _Stop."""
        structured = self.answer_format != "text"
        system = system_prompt(structured)
        try:
            prompt = self._fit(build, system, structured)
        except ContextFull as exc:
            raise _Stop(str(exc)) from None
        messages = [{"role": "user", "content": prompt}]
        asked = "the proposal prompt" if last_bad is None else "again, after: " + last_bad[1]
        if last_bad is not None:
            feedback = feedback_prompt(last_bad[1], structured)
            clip = self._room_for_answer(system, prompt + feedback)
            messages += [{"role": "assistant", "content": last_bad[0][:clip] or "(empty)"},
                         {"role": "user", "content": feedback}]
        prompt_tokens = self.meter.messages(system, messages)
        max_tokens = output_budget(self.context, prompt_tokens, self.profile.max_output_tokens)
        if max_tokens == 0:
            raise _Stop(f"the prompt (~{prompt_tokens} tokens) leaves no room for an answer in "
                        f"the model's context of {self.context} tokens")
        room, cap = self._cap_room(ctx, conv, prompt_tokens)
        if cap:
            raise _Stop(cap)
        max_tokens = max_tokens if room is None else min(max_tokens, room)
        schema = edit_schema(ctx.files) if structured else None
        return ChatRequest(system, messages, max_tokens, self.answer_format, schema), asked

    def _fit(self, build: Build, system: str, structured: bool) -> str:
        """The prompt with as much history (and program.md) as the context leaves room for."""
        if not self.meter.observed and not self._counted:  # the server's tokenizer, once
            self._counted = True
            sample = system + build(0, PromptStyle(structured))
            tokens = self.backend.count_tokens(sample)
            if tokens:
                self.meter.calibrate(sample, tokens)
        cpt, out = self.meter.chars_per_token, self.profile.max_output_tokens
        last: ContextFull | None = None
        for program in (True, False):
            style = PromptStyle(structured, cpt, program)
            fixed = self.meter.messages(system, [{"role": "user", "content": build(0, style)}])
            try:
                history = history_budget(self.context, fixed, self.profile.history_tokens, out)
            except ContextFull as exc:
                last = exc
                continue
            return build(history, style)
        assert last is not None
        raise last

    def _room_for_answer(self, system: str, text: str) -> int:
        """Characters of the last answer a re-ask can carry (the answer is clipped to fit)."""
        if self.context is None:
            return ANSWER_CHARS
        turns = [{"role": "user", "content": text}, {"role": "assistant", "content": ""},
                 {"role": "user", "content": ""}]
        left = (self.context - margin(self.context) - OUTPUT_FLOOR_TOKENS
                - self.meter.messages(system, turns))
        return max(0, min(ANSWER_CHARS, int(left * self.meter.chars_per_token)))

    def _failed_call(self, ctx: ProposalContext, conv: Conversation, request: ChatRequest,
                     asked: str, exc: LLMError, shrinks: int) -> str:
        """What a failed call means: "again" (shrunk, or another format), "fatal", or the
        verdict of an unusable proposal."""
        logger.warning("%s: %s", self.name, exc)
        if exc.kind == "format" and len(self.formats) > 1:
            logger.info("%s: the server refuses answer format %s; trying %s", self.name,
                        self.formats[0], self.formats[1])
            self.formats.pop(0)
            return "again"
        if exc.kind == "fatal":
            return "fatal"
        entry = conv.turn(asked, format=request.answer_format, max_tokens=request.max_tokens)
        if exc.kind == "timeout":  # the server spent the prompt and up to max_tokens on it
            tokens_in = self.meter.messages(request.system, request.messages)
            conv.spend(tokens_in, request.max_tokens,
                       self.profile.cost_usd(tokens_in, request.max_tokens), exc.retries, True)
        conv.fail(entry, exc.kind, str(exc))
        if exc.kind == "length":
            named = context_in_error(str(exc))
            if named and (self.context is None or named < self.context):
                self._context = named
            self.meter.refused()
            if shrinks < MAX_SHRINKS:
                return "again"
            return (f"prompt_too_long: the model's context refused the prompt {shrinks + 1} "
                    f"times, shrunk each time: {exc}")
        if exc.kind == "timeout":
            return f"timeout: the model did not answer: {exc}"
        return f"server_error: the model's server failed: {exc}"

    def _answered(self, conv: Conversation, request: ChatRequest, asked: str,
                  reply: ChatReply) -> dict[str, Any]:
        conv.spend(reply.tokens_in, reply.tokens_out,
                   self.profile.cost_usd(reply.tokens_in, reply.tokens_out), reply.retries,
                   not reply.reported)
        if reply.reported:
            self.meter.observe(request.system, request.messages, reply.tokens_in)
        return conv.turn(asked, format=request.answer_format, max_tokens=request.max_tokens,
                         answer=reply.text, tokens_in=reply.tokens_in,
                         tokens_out=reply.tokens_out, seconds=round(reply.seconds, 2),
                         finish=reply.finish or None)

    # --- the records ----------------------------------------------------------------------
    def _meta(self, conv: Conversation, raw: str, shape: str, category: Category,
              repairs: int | None) -> dict[str, Any]:
        meta: dict[str, Any] = {**conv.as_meta(), "llm_model": self.profile.model,
                                "answer_shape": shape, "raw_answer": raw[:RAW_ANSWER_CHARS],
                                "category": category.value}
        if repairs is not None:
            meta["repairs"] = repairs
        return meta

    def _proposal(self, valid: ValidAnswer, conv: Conversation, raw: str,
                  repairs: int | None) -> Proposal:
        return Proposal(description=valid.description, diff=valid.diff, proposer=self.name,
                        meta=self._meta(conv, raw, valid.shape, valid.category, repairs))

    def _unusable(self, conv: Conversation, raw: str, candidate: tuple[str, str] | None,
                  fallback: str | None, verdict: str, repairs: int | None) -> Proposal:
        """A proposal admission refuses with the model's own fault as the reason."""
        description, diff = candidate or (fallback or "unusable LLM answer", "")
        code, _, message = verdict.partition(": ")
        n = conv.answers
        said = (f"the model gave no usable change in {n} answer{'s' if n != 1 else ''}; "
                f"the last: {message}" if n else message)
        meta = self._meta(conv, raw, "unusable", category_of_answer(raw, description, diff),
                          repairs)
        meta["unusable"] = {"code": code or "unusable", "message": said}
        return Proposal(description=description, diff=diff, proposer=self.name, meta=meta)

    def _give_up(self, ctx: ProposalContext, conv: Conversation, why: str) -> None:
        """No proposal: the sweep ends with `why` (tokens spent on the way still count)."""
        logger.error("%s: %s", self.name, why)
        self.out_of_ideas = why
        u = conv.usage
        if u.calls and self.store is not None:
            self.store.add_llm_usage(ctx.sweep.id, None, u.tokens_in, u.tokens_out, u.usd)


def make_llm_proposer(profile: str, *, seed: int = 42, config_path: Path | str | None = None,
                      store: Any = None, backend: ChatBackend | None = None,
                      **overrides: Any) -> LLMProposer:
    """Build the proposer for `llm:<profile>` (wired by overnight.runtime.make_proposer).

    `overrides` replace profile fields (e.g. max_llm_usd=2.0) for this sweep only.
    """
    prof = load_profile(profile, config_path)
    if overrides:
        prof = prof.model_copy(update=overrides)
    return LLMProposer(prof, backend or make_backend(prof), seed=seed, store=store)
