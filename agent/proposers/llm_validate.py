"""Check a model's answer as a proposal: parse it, then the pure admission rules, the duplicate
check over the sweep's history and the category caps. Raises AdmissionError for the model."""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.analysis.trials import constant_changes
from agent.core.diff import normalize as normalize_diff
from agent.core.domain import ExperimentStatus, Proposal
from agent.core.errors import AdmissionError
from agent.core.ports import ProposalContext
from agent.proposers.llm_parse import description_of, extract_diff_text, parse_answer
from agent.rules.admit import check_proposal
from agent.rules.categories import (
    Category,
    category_of_knob,
    category_of_text,
    exhausted,
    parse_category,
)

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
class Valid:
    description: str
    diff: str
    shape: str
    category: Category


def validate(ctx: ProposalContext, raw: str, fallback: str | None, finish: str = "",
             tokens_out: int = 0) -> Valid:
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
    return Valid(description, parsed.diff, parsed.shape, category)


def salvage(raw: str, fallback: str | None) -> tuple[str, str] | None:
    """For the rejected record: the answer's own diff text, if it had one."""
    diff = extract_diff_text(raw)
    return (description_of(raw) or fallback or "unusable LLM answer", diff) if diff else None
