"""A sweep's counts and training time (Rollup), summed over experiments or kept as running
state by the sweep page's fold (each finished experiment adds to the counts and time)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from agent.core.domain import RAN_STATUSES, ExperimentStatus

S = ExperimentStatus
RUNS = RAN_STATUSES


@dataclass
class Rollup:
    """Counts and time used by one sweep."""

    counts: Counter[str] = field(default_factory=Counter)
    train_s: float = 0.0

    @property
    def runs(self) -> int:
        return sum(self.counts[s.value] for s in RUNS)

    @property
    def crashed(self) -> int:
        return self.counts[S.CRASHED.value] + self.counts[S.TIMEOUT.value]

    @property
    def kept_changes(self) -> int:
        """Kept changes: the baseline (always kept, once it ran) left out."""
        return max(0, self.counts[S.KEPT.value] - 1)

    @property
    def keep_rate(self) -> float | None:
        # The baseline is always kept; it is not an idea, so leave it out of the rate.
        tried = self.runs - 1
        return (self.counts[S.KEPT.value] - 1) / tried if tried > 0 else None

    @property
    def gpu_hours(self) -> float:
        return self.train_s / 3600

    def add(
        self, status: str, started: datetime | None, ended: datetime | None, now: datetime
    ) -> None:
        self.counts[status] += 1
        if started is not None and (ended is not None or status == S.RUNNING.value):
            self.train_s += max(0.0, ((ended or now) - started).total_seconds())
