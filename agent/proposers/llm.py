"""The `llm:<profile>` proposer: ask a chat model for one change; validate; repair trivial crashes.

Each ask is fitted to the model's context (the profile's `context_tokens`, else what the
server says, else what a length refusal names; agent.proposers.llm_budget) and to the sweep's
caps, so a call never asks for more than either leaves. The answer is asked for as a JSON edit
where the server takes a schema (agent.proposers.llm_formats; "auto" falls back format by
format to free text), parsed, checked with the same pure admission rules as any external
proposal plus a duplicate check, and re-asked with only the last unusable answer and what was
wrong with it, at most `answer_retries` times. A prompt the context refuses is shrunk and asked
again. An answer that stays unusable, a timeout (never retried) or a server that stays down
yields a proposal marked `unusable` with the model's own fault as the reason, so the loop
records it `rejected` and asks again. Only a fatal error (a bad key, an unknown model), files
too large for the context or a cap ends the sweep (propose returns None, `out_of_ideas` says
why). Every answer, error and token is kept (agent.proposers.llm_record).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.core.domain import Experiment, Proposal
from agent.core.errors import AdmissionError
from agent.core.ports import ProposalContext
from agent.proposers.llm_backends import ChatBackend, ChatReply, ChatRequest, LLMError, make_backend
from agent.proposers.llm_budget import (
    OUTPUT_FLOOR_TOKENS,
    ContextFull,
    TokenMeter,
    context_in_error,
    history_budget,
    margin,
    output_budget,
)
from agent.proposers.llm_config import LLMProfile, load_profile
from agent.proposers.llm_formats import ANTHROPIC_AUTO, OPENAI_AUTO, edit_schema
from agent.proposers.llm_prompt import (
    PromptStyle,
    feedback_prompt,
    propose_prompt,
    repair_prompt,
    system_prompt,
)
from agent.proposers.llm_record import ANSWER_CHARS, USAGE_KEY, Conversation
from agent.proposers.llm_validate import Valid, category_of_answer, salvage, validate
from agent.rules.categories import Category

__all__ = ["USAGE_KEY", "LLMProposer", "category_of_answer", "make_llm_proposer"]
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

    def _proposal(self, valid: Valid, conv: Conversation, raw: str,
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
    """Build the proposer for `llm:<profile>` (wired by agent.proposers.factory).

    `overrides` replace profile fields (e.g. max_llm_usd=2.0) for this sweep only.
    """
    prof = load_profile(profile, config_path)
    if overrides:
        prof = prof.model_copy(update=overrides)
    return LLMProposer(prof, backend or make_backend(prof), seed=seed, store=store)
