"""What one conversation with the model spent and said, kept with the proposal it produced.

Every answer of a conversation is kept (each clipped to ANSWER_CHARS, at most MAX_TURNS turns)
with what was asked, the format, the tokens, the seconds and what was wrong with it, in
`meta["llm_conversation"]`; the totals in `meta["llm_usage"]` are what the sweep's caps count.
A failed call (a timeout, a prompt the context refused) is a turn too: its tokens count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
