"""Keep-or-discard rule. Pure: stdlib and domain only."""

from __future__ import annotations

import math

from agent.domain import Direction


def is_improvement(
    metric: float | None,
    best: float | None,
    direction: Direction,
    min_delta: float = 0.0,
) -> bool:
    """True when `metric` beats `best` by more than `min_delta` (strictly better at 0).

    A missing or non-finite metric never wins; with no best yet, any finite metric does.
    """
    if metric is None or not math.isfinite(metric):
        return False
    if best is None or not math.isfinite(best):
        return True
    if direction is Direction.MINIMIZE:
        return metric < best - min_delta
    return metric > best + min_delta
