"""The `llm:<profile>` proposer: ask a chat model for one change; validate; repair trivial crashes.

An answer is parsed (diff, SEARCH/REPLACE or full file), checked with the same pure admission
rules as any external proposal plus a duplicate check over the sweep's history, and re-asked
with the error shown at most `answer_retries` times. An answer that stays unusable is still
returned, carrying the raw text in `meta`, so the loop records it as `rejected` for inspection.
Token use and estimated dollars ride along in `meta["llm_usage"]` and are recorded with the
experiment; the per-sweep caps stop the proposer (it returns None) once reached.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.analysis.trials import constant_changes
from agent.core.diff import normalize as normalize_diff
from agent.core.domain import Experiment, ExperimentStatus, Proposal
from agent.core.errors import AdmissionError
from agent.core.ports import ProposalContext
from agent.proposers.llm_backends import ChatBackend, LLMError, make_backend
from agent.proposers.llm_config import LLMProfile, load_profile
from agent.proposers.llm_parse import description_of, extract_diff_text, parse_answer
from agent.proposers.llm_prompt import SYSTEM, feedback_prompt, propose_prompt, repair_prompt
from agent.rules.admit import check_proposal
from agent.rules.categories import (
    Category,
    category_of_knob,
    category_of_text,
    exhausted,
    parse_category,
)

logger = logging.getLogger(__name__)
RAW_ANSWER_CHARS = 20_000
USAGE_KEY = "llm_usage"
_CATEGORY = re.compile(r"^\W*CATEGORY\W*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass
class Usage:
    tokens_in: int = 0
    tokens_out: int = 0
    usd: float = 0.0
    calls: int = 0
    http_retries: int = 0

    def as_meta(self) -> dict[str, Any]:
        return {"tokens_in": self.tokens_in, "tokens_out": self.tokens_out,
                "usd": round(self.usd, 6), "calls": self.calls, "http_retries": self.http_retries}


def category_of_answer(raw: str, description: str, diff: str) -> Category:
    """The category the model stated, else one guessed from the constants or the words."""
    m = _CATEGORY.search(raw)
    stated = parse_category(m.group(1).strip("*`_ ")) if m else None
    if stated is not None:
        return stated
    changes, _ = constant_changes(diff)
    return category_of_knob(changes[0].name) if changes else category_of_text(description)


class LLMProposer:
    def __init__(self, profile: LLMProfile, backend: ChatBackend, *, seed: int = 42,
                 store: Any = None) -> None:
        self.profile, self.backend, self.seed = profile, backend, seed
        self.name = f"llm:{profile.name}"
        self.out_of_ideas: str | None = None
        self.store = store  # records usage that no proposal carries (a failed conversation)

    # --- caps -----------------------------------------------------------------------------
    def cap_reached(self, ctx: ProposalContext, pending: Usage | None = None) -> str | None:
        tokens, usd = ctx.llm_tokens, ctx.llm_usd  # the sweep's counters in the store
        tokens += pending.tokens_in + pending.tokens_out if pending else 0
        usd += pending.usd if pending else 0.0
        p = self.profile
        if p.max_llm_tokens is not None and tokens >= p.max_llm_tokens:
            return f"LLM token cap reached: {tokens} >= max_llm_tokens={p.max_llm_tokens}"
        if p.max_llm_usd is not None and usd >= p.max_llm_usd:
            return f"LLM spend cap reached: ${usd:.4f} >= max_llm_usd={p.max_llm_usd:g}"
        return None

    # --- Proposer protocol ----------------------------------------------------------------
    def propose(self, ctx: ProposalContext) -> Proposal | None:
        self.out_of_ideas = None
        return self._converse(ctx, propose_prompt(ctx, self.profile.history_tokens),
                              fallback_description=None)

    def repair(self, ctx: ProposalContext, failed: Experiment) -> Proposal | None:
        return self._converse(ctx, repair_prompt(ctx, failed, self.profile.history_tokens),
                              fallback_description=f"{failed.description} (fixed)",
                              repairs=failed.id)

    # --- one conversation -----------------------------------------------------------------
    def _converse(self, ctx: ProposalContext, prompt: str, *, fallback_description: str | None,
                  repairs: int | None = None) -> Proposal | None:
        usage = Usage()
        messages = [{"role": "user", "content": prompt}]
        errors: list[str] = []
        raw = ""
        candidate: tuple[str, str] | None = None
        for attempt in range(1 + self.profile.answer_retries):
            stop = self.cap_reached(ctx, usage)
            if stop:
                logger.warning("%s: %s; not asking the model", self.name, stop)
                if attempt == 0:
                    self.out_of_ideas = stop
                    return None
                break
            try:
                reply = self.backend.complete(SYSTEM, messages)
            except LLMError as exc:
                logger.error("%s: %s", self.name, exc)
                self._record_unattributed(ctx, usage)
                self.out_of_ideas = f"the language model failed: {exc}"
                return None
            usage.tokens_in += reply.tokens_in
            usage.tokens_out += reply.tokens_out
            usage.usd += self.profile.cost_usd(reply.tokens_in, reply.tokens_out)
            usage.calls += 1
            usage.http_retries += reply.retries
            raw = reply.text
            try:
                description, diff, shape, category = self._validate(ctx, raw,
                                                                    fallback_description)
            except AdmissionError as exc:
                errors.append(f"{exc.code}: {exc.message}")
                candidate = candidate or self._salvage(raw, fallback_description)
                logger.info("%s: unusable answer (%s), attempt %d", self.name, exc.code,
                            attempt + 1)
                messages += [{"role": "assistant", "content": raw or "(empty)"},
                             {"role": "user", "content": feedback_prompt(exc.message)}]
                continue
            return self._proposal(description, diff, usage, raw, errors, shape, repairs,
                                  category)
        description, diff = candidate or (fallback_description or "unusable LLM answer", "")
        return self._proposal(description, diff, usage, raw, errors, "unusable", repairs,
                              category_of_answer(raw, description, diff))

    def _validate(self, ctx: ProposalContext, raw: str,
                  fallback: str | None) -> tuple[str, str, str, Category]:
        parsed = parse_answer(raw, ctx.files)
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
        category = category_of_answer(raw, description, parsed.diff)
        capped = exhausted(ctx.history, dict(ctx.sweep.config.category_shares),
                           ctx.sweep.max_experiments)
        if category in capped and fallback is None:  # a repair keeps its idea's category
            raise AdmissionError("category_exhausted", f"the {category.value} category has used "
                                 f"its share of this sweep ({capped[category]}); propose a "
                                 "different kind of change")
        return description, parsed.diff, parsed.shape, category

    @staticmethod
    def _salvage(raw: str, fallback: str | None) -> tuple[str, str] | None:
        """For the rejected record: the answer's own diff text, if it had one."""
        diff = extract_diff_text(raw)
        return (description_of(raw) or fallback or "unusable LLM answer", diff) if diff else None

    def _proposal(self, description: str, diff: str, usage: Usage, raw: str, errors: list[str],
                  shape: str, repairs: int | None, category: Category) -> Proposal:
        meta: dict[str, Any] = {USAGE_KEY: usage.as_meta(), "llm_model": self.profile.model,
                                "answer_shape": shape, "raw_answer": raw[:RAW_ANSWER_CHARS],
                                "category": category.value}
        if errors:
            meta["llm_errors"] = errors
        if repairs is not None:
            meta["repairs"] = repairs
        return Proposal(description=description, diff=diff, proposer=self.name, meta=meta)

    def _record_unattributed(self, ctx: ProposalContext, usage: Usage) -> None:
        """Tokens spent on a conversation that produced no proposal still count."""
        if not usage.calls:
            return
        if self.store is not None:
            self.store.add_llm_usage(ctx.sweep.id, None, usage.tokens_in, usage.tokens_out,
                                     usage.usd)


def make_llm_proposer(profile: str, *, seed: int = 42, config_path: Path | str | None = None,
                      store: Any = None, backend: ChatBackend | None = None,
                      **overrides: Any) -> LLMProposer:
    """Build the proposer for `llm:<profile>` (wired by agent.proposers.factory).

    `overrides` replace profile fields (e.g. max_llm_usd=2.0) for this sweep only.
    """
    prof = load_profile(profile, config_path)
    if overrides:
        prof = prof.model_copy(update=overrides)
    return LLMProposer(prof, backend or make_backend(prof), seed=seed, store=store)
