"""Fit a prompt and its answer into a model's context and the sweep's caps. Pure.

Token counts are estimated from characters with a ratio the server corrects: it starts at a
measured prior (PRIOR_CHARS_PER_TOKEN), is set by the server's own tokenizer where it offers
one (llama.cpp, llama-cpp-python) before the first ask, and then follows the prompt tokens each
reply reports. A context that refuses a prompt teaches the meter both the real context and a
lower ratio; MARGIN covers what is left of the error.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# Characters per token of what this proposer sends, measured with SmolLM2's tokenizer
# (benchmarks/llm_tokens.py): 2.4-2.9 on train.py-style code, 3.0 on the gpt target's first ask,
# 3.4-4.2 on prose. The prior serves only until the server's tokenizer or its first reply says.
PRIOR_CHARS_PER_TOKEN = 3.0
MESSAGE_OVERHEAD_TOKENS = 8  # a chat template's role markers, per message
MARGIN = 0.03  # of the context, for the estimate's error
MARGIN_MIN_TOKENS = 64
OUTPUT_FLOOR_TOKENS = 256  # a structured one-edit answer fits; less is not worth asking
OUTPUT_SHARE = 0.25  # of the context reserved for the answer before the history is sized
SHRINK = 0.85  # the ratio after a prompt the context refused
_CONTEXT_IN_ERROR = (
    re.compile(r"maximum context length is (\d+)", re.I),
    re.compile(r"context (?:window|size|length) of (\d+)", re.I),
    re.compile(r'"n_ctx"\s*:\s*(\d+)'),
)


class ContextFull(Exception):  # noqa: N818  (a condition, raised and caught in one module)
    """What must be shown (system, files, instructions) does not fit the model's context."""


@dataclass
class TokenMeter:
    """chars -> tokens, corrected by what the server counts."""

    chars_per_token: float = PRIOR_CHARS_PER_TOKEN
    observed: int = 0  # replies that reported their prompt tokens

    def tokens(self, text: str) -> int:
        return max(1, math.ceil(len(text) / self.chars_per_token))

    def messages(self, system: str, messages: list[dict[str, str]]) -> int:
        chars = len(system) + sum(len(m["content"]) for m in messages)
        overhead = MESSAGE_OVERHEAD_TOKENS * (len(messages) + 1)
        return max(1, math.ceil(chars / self.chars_per_token)) + overhead

    def observe(self, system: str, messages: list[dict[str, str]], prompt_tokens: int) -> None:
        """Learn the ratio from a reply's reported prompt tokens (the template's overhead out)."""
        chars = len(system) + sum(len(m["content"]) for m in messages)
        text_tokens = prompt_tokens - MESSAGE_OVERHEAD_TOKENS * (len(messages) + 1)
        if chars >= 200 and text_tokens > 0:
            self.chars_per_token = chars / text_tokens
            self.observed += 1

    def calibrate(self, text: str, tokens: int) -> None:
        """Set the ratio from a tokenizer's count of `text`."""
        if len(text) >= 200 and tokens > 0:
            self.chars_per_token = len(text) / tokens
            self.observed += 1

    def refused(self) -> None:
        """The server refused a prompt as too long: our ratio was too high."""
        self.chars_per_token *= SHRINK


def context_in_error(message: str) -> int | None:
    """The context size a length error names ("maximum context length is 8192 tokens")."""
    for pattern in _CONTEXT_IN_ERROR:
        m = pattern.search(message)
        if m:
            return int(m.group(1))
    return None


def margin(context: int) -> int:
    return max(MARGIN_MIN_TOKENS, int(context * MARGIN))


def history_budget(context: int | None, fixed_tokens: int, history_tokens: int,
                   max_output: int) -> int:
    """Tokens left for the digest and the results table once the fixed part and an answer
    fit. Raises ContextFull when the fixed part leaves no room for even a short answer."""
    if context is None:
        return history_tokens
    room = context - margin(context) - fixed_tokens
    if room < OUTPUT_FLOOR_TOKENS:
        raise ContextFull(f"the editable files and instructions need about {fixed_tokens} "
                          f"tokens; the model's context of {context} tokens leaves no room "
                          f"for an answer (use a model with a larger context)")
    reserve = min(max_output, max(OUTPUT_FLOOR_TOKENS, int(context * OUTPUT_SHARE)))
    return max(0, min(history_tokens, room - reserve))


def output_budget(context: int | None, prompt_tokens: int, max_output: int) -> int:
    """max_tokens for a request: what the context leaves after the prompt, at most max_output
    (0 when not even OUTPUT_FLOOR_TOKENS is left: do not ask)."""
    if context is None:
        return max_output
    left = min(max_output, context - margin(context) - prompt_tokens)
    return left if left >= min(OUTPUT_FLOOR_TOKENS, max_output) else 0
