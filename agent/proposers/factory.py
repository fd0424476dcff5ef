"""Build a sweep's proposer from its spec: `knobs`, `queue` (external only) or `llm:<profile>`."""

from __future__ import annotations

from typing import Any

from agent.core.errors import ConfigError
from agent.core.ports import Proposer, Store


def make_proposer(spec: str, seed: int, store: Store | None = None,
                  **kwargs: Any) -> Proposer | None:
    """`knobs` (the learning search), `queue` (external proposals only → None) or
    `llm:<profile>`.

    `store` lets a language-model proposer record spend that no proposal carries."""
    if spec == "knobs":
        from agent.proposers.knobs import KnobsProposer

        return KnobsProposer(seed=seed)
    if spec == "queue":
        return None
    if spec.startswith("llm:"):
        from agent.proposers.llm import make_llm_proposer

        return make_llm_proposer(spec.split(":", 1)[1], seed=seed, store=store, **kwargs)
    raise ConfigError(f"proposer: unknown proposer {spec!r} "
                      "(use knobs, queue or llm:<profile>)")
