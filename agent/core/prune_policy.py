"""The early stop's policy (where agent.rules.prune judges a run), validated on construction: a
target's `[prune]` table (agent.core.config) and its `max_runs` make one of these.

Pure: the stdlib only. Here, not in agent/rules, so the config can build and validate it
(core imports nothing above it); agent.rules.prune re-exports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PrunePolicy:
    """A run's budget is cut into `looks` equal parts, as a change's runs are the keep test's
    `looks` (its `max_runs`); the run is judged at the end of each part but the last, on its
    loss over that part. No number of its own."""

    looks: int = 4  # the keep rule's max_runs
    # Curves that cross late (the model's exception): schedule changes, and optimizer changes
    # (the demo's USE_MUON winner is behind at 50 % and ahead at the end).
    exempt: frozenset[str] = field(
        default_factory=lambda: frozenset({"data/schedule", "optimizer"}))

    def __post_init__(self) -> None:
        if isinstance(self.looks, bool) or not isinstance(self.looks, int) or self.looks < 2:
            raise ValueError(f"prune policy: looks must be a whole number ≥ 2 (the keep rule's "
                             f"max_runs), got {self.looks!r}")

    @property
    def checks(self) -> tuple[float, ...]:
        """The fractions of the budget where a run is judged: 1/K, 2/K, …, (K − 1)/K."""
        return tuple(j / self.looks for j in range(1, self.looks))

    def part(self, index: int) -> tuple[float, float]:
        """The stretch of the budget check `index` reads, (start, end]: from the check before
        it (the run's start for the first) to its own fraction."""
        return (index / self.looks if index else -math.inf), self.checks[index]
