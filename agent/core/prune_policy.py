"""The early stop's policy (agent.rules.prune's checks, margins and guards), validated on
construction: a target's `[prune]` table (agent.core.config) is one of these.

Pure: the stdlib only. Here, not in agent/rules, so the config can build and validate it
(core imports nothing above it); agent.rules.prune re-exports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PrunePolicy:
    checks: tuple[float, ...] = (0.3, 0.5, 0.7)  # fractions of the budget where a run is judged
    # margin in sds of (run − incumbent mean), strict early
    z: tuple[float, ...] = (5.0, 4.0, 3.5)
    window: float = 0.05  # the loss at f is the median of the curve's points in [f − window, f]
    min_curves: int = 3  # incumbent curves needed to calibrate a spread (2: one degree of
    # freedom per check, a spread too often far too small)
    floor_rel: float = 0.01  # the margin is at least this share of the reference loss
    speed_tol: float = 0.15  # a run whose speed so far departs more than this is not judged
    exempt: frozenset[str] = field(default_factory=lambda: frozenset({"data/schedule"}))
    # the spread the margins use: the one-sided upper confidence bound of the incumbents' sd at
    # this level, from its degrees of freedom (0: the estimate itself); a few curves often
    # give a spread far too small, and a late-crossing winner is then stopped
    # (benchmarks/keep_rule.py --night budget: at 0, z (5, 4, 3.5) stopped 1.1 % of the
    # winners, late-crossing ones outside the exempt categories; at 0.95, 0.2 %)
    spread_upper: float = 0.95
    # futility (``futile``): per check, a run whose loss is above the incumbent's mean by more
    # than futile_z · spread · √(1 + 1/n) is unlikely to end significantly better (inf: not
    # at that check; None: off)
    futile_z: tuple[float, ...] | None = None
    futile_runs: int = 1  # judged on a change's first this-many runs (later ones follow a
    # promising first run: the keep rule's own discard decides them)
    # the earlier incumbents of the sweep (most recent first) whose curves pool into the spread
    # (0: the current incumbent's alone; then a new incumbent with 2 runs is never judged)
    pool_earlier: int = 3

    def __post_init__(self) -> None:
        if not self.checks or len(self.z) != len(self.checks):
            raise ValueError(f"prune policy: {len(self.checks)} checks need as many z values, "
                             f"got {len(self.z)}")
        if any(not 0 < f < 1 for f in self.checks) or list(self.checks) != sorted(self.checks):
            raise ValueError(f"prune policy: checks must be increasing fractions in (0, 1), "
                             f"got {self.checks}")
        if any(not z > 0 for z in self.z):
            raise ValueError(f"prune policy: z must be positive numbers, got {self.z}")
        if not self.window > 0:
            raise ValueError(f"prune policy: window must be positive, got {self.window}")
        if self.min_curves < 2:
            raise ValueError(f"prune policy: min_curves must be ≥ 2, got {self.min_curves}")
        if self.futile_z is not None and len(self.futile_z) != len(self.checks):
            raise ValueError(f"prune policy: {len(self.checks)} checks need as many futile_z "
                             f"values, got {len(self.futile_z)}")
        if self.futile_z is not None and any(math.isnan(z) for z in self.futile_z):
            raise ValueError(f"prune policy: futile_z must be numbers (inf: not judged there), "
                             f"got {self.futile_z}")
        if not 0 <= self.spread_upper < 1:
            raise ValueError(f"prune policy: spread_upper must be a level in [0, 1), got "
                             f"{self.spread_upper}")
        if self.futile_runs < 0:
            raise ValueError(f"prune policy: futile_runs must be ≥ 0, got {self.futile_runs}")
        if self.pool_earlier < 0:
            raise ValueError(f"prune policy: pool_earlier must be ≥ 0, got {self.pool_earlier}")
        if not self.floor_rel >= 0 or not self.speed_tol > 0:
            raise ValueError(f"prune policy: floor_rel must be ≥ 0 and speed_tol > 0, got "
                             f"{self.floor_rel} and {self.speed_tol}")
