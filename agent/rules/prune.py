"""The early stop: a futility boundary beside the keep rule's test, taken at a fraction of the
budget on the training loss (docs/keep-rule.md#the-early-stop): behind at P(T ≤ t) ≤ the level
(agent.rules.decide.stop_level). Pure: the stdlib, the policy and agent.rules.noise only. A
curve is ``(fraction of the training budget, training loss)`` points, lower is better whatever
the metric's direction. Not guaranteed: that a stopped change would have lost at the end.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from agent.core.prune_policy import PrunePolicy
from agent.rules.noise import pooled_of, squared_deviations, t_score, t_sf

__all__ = ["PruneCall", "PrunePolicy", "check", "loss_over", "next_check"]
Curve = Sequence[tuple[float, float]]


@dataclass(frozen=True)
class PruneCall:
    """One check's outcome; ``why`` says why the run goes on, or that it is behind."""

    stop: bool
    fraction: float
    why: str
    loss: float | None = None
    reference: float | None = None
    se: float | None = None
    p_worse: float | None = None
    start: float = 0.0  # where the part the check read begins (the check before it)

    def reason(self) -> str:
        """For a person: ``stopped at 50 % of the budget: loss 3.41 over 25–50 % vs the
        incumbent's 3.12 ± 0.05 there`` (or why it was not stopped)."""
        at = f"{round(self.fraction * 100)} % of the budget"
        if self.loss is None or self.reference is None:
            return f"not judged at {at}: {self.why}"
        se = f" ± {_fmt(self.se)}" if self.se is not None else ""
        head = "stopped" if self.stop else "went on"
        text = (f"{head} at {at}: loss {_fmt(self.loss)} over {round(self.start * 100)}–"
                f"{round(self.fraction * 100)} % vs the incumbent's {_fmt(self.reference)}{se} "
                "there")
        return text + ("" if self.stop else f" ({self.why})")


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return str(x)
    if abs(x) < 0.01 or abs(x) >= 1000:
        return f"{x:.3g}"
    return f"{x:.2f}" if abs(x) >= 1 else f"{x:.3f}"


def loss_over(curve: Curve, part: tuple[float, float]) -> float | None:
    """The median loss of the points in the part (start, end] of the budget; None if there are
    none (non-finite losses are left out)."""
    start, end = part
    here = [loss for f, loss in curve
            if start + 1e-9 < f <= end + 1e-9 and math.isfinite(loss)]
    return statistics.median(here) if here else None


def next_check(fraction_now: float, judged: int, policy: PrunePolicy) -> int | None:
    """The index of the check due now (the latest reached, when several were passed at once),
    given that the first ``judged`` checks are done; None when none is due."""
    due = None
    for i in range(judged, len(policy.checks)):
        if fraction_now + 1e-9 >= policy.checks[i]:
            due = i
    return due


def check(challenger: Curve, incumbents: Sequence[Curve], index: int, level: float,
          policy: PrunePolicy = PrunePolicy(), *, category: str | None = None,
          speed_off: bool = False, earlier: Sequence[Sequence[Curve]] = ()) -> PruneCall:
    """Judge the run at ``policy.checks[index]``: its loss over the part of the budget since
    the check before (the median of its points there) against the mean of the incumbent's
    curves over the same part, the spread pooled with ``earlier`` (the earlier incumbents'
    curves, one group per commit), on Student's t; stopped when worse with P(T ≤ t) ≤
    ``level``. Not judged: an exempt category, ``speed_off`` (its speed so far is off the
    incumbent's), no point in the part, curves with no spread."""
    fraction = policy.checks[index]
    if category is not None and category in policy.exempt:
        return PruneCall(False, fraction, f"{category} changes are not stopped early "
                                          "(their curves can cross late)")
    if speed_off:
        return PruneCall(False, fraction, "its speed so far differs from the incumbent's, so "
                                          "its loss curve measures the machine")
    part = policy.part(index)
    loss = loss_over(challenger, part)
    if loss is None:
        return PruneCall(False, fraction, "no progress line since the check before")
    incumbent_losses = _column(incumbents, part)
    groups = [incumbent_losses, *(_column(g, part) for g in earlier)]
    sd, df = pooled_of([squared_deviations(groups)])
    if not incumbent_losses or sd is None:
        return PruneCall(False, fraction, "the incumbent's curves show no spread here yet")
    reference = statistics.fmean(incumbent_losses)
    se = sd * math.sqrt(1 + 1 / len(incumbent_losses))
    p_worse = 1.0 - t_sf(t_score(reference - loss, se), df)
    stop = p_worse <= level
    why = "clearly behind" if stop else f"not clearly behind (P {p_worse:.2g} > {level:.2g})"
    return PruneCall(stop, fraction, why, loss, reference, se, p_worse, max(part[0], 0.0))


def _column(curves: Sequence[Curve], part: tuple[float, float]) -> list[float]:
    """The curves' losses over `part` (those that reach it)."""
    return [v for c in curves if (v := loss_over(c, part)) is not None]
