"""The early stop's policy (where agent.rules.prune judges a run), validated on construction: a
target's `[prune]` table (agent.core.config) is one of these.

Pure: the stdlib only. Here, not in agent/rules, so the config can build and validate it
(core imports nothing above it); agent.rules.prune re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PrunePolicy:
    checks: tuple[float, ...] = (0.3, 0.5, 0.7)  # fractions of the budget where a run is judged
    window: float = 0.05  # the loss at f is the median of the curve's points in [f − window, f]
    exempt: frozenset[str] = field(default_factory=lambda: frozenset({"data/schedule"}))

    def __post_init__(self) -> None:
        if not self.checks or any(not 0 < f < 1 for f in self.checks) or \
                list(self.checks) != sorted(self.checks):
            raise ValueError(f"prune policy: checks must be increasing fractions in (0, 1), "
                             f"got {self.checks}")
        if not self.window > 0:
            raise ValueError(f"prune policy: window must be positive, got {self.window}")
