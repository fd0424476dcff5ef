"""Early stop of a clearly losing run: its training loss at a fraction of the budget against the
incumbent's runs at the same fraction, with a margin calibrated from their spread.

Pure: the stdlib only. A curve is ``(fraction of the training budget, training loss)`` points in
order (lower loss is better: it is the training loss, whatever the metric's direction). At each
check fraction a run is judged once; it is stopped only when its loss there is above the
incumbent's mean by more than the margin. Guaranteed: ``check`` never stops a run when

- fewer than ``min_curves`` incumbent curves reach the fraction (no spread to calibrate from),
- the run has no point in the window ending at the fraction,
- the change's category is exempt (its curves are known to cross: schedule knobs),
- its speed so far departs from the incumbent's by more than ``speed_tol`` (then the curve
  measures the machine, and the comparison beside the incumbent decides, not this rule),
- or it is within the margin.

The spread is the incumbent curves' standard deviation at the check's fraction, pooled with the
earlier check fractions (more degrees of freedom than n − 1 at one point); the margin is
``max(z · spread · √(1 + 1/n), floor_rel · |reference|)``: one run against the mean of n.
Not guaranteed: that a change stopped here would have lost at the end (curves that cross late
exist; that is what ``z`` per check and ``exempt`` are for, calibrated by benchmarks/keep_rule.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

Curve = Sequence[tuple[float, float]]


@dataclass(frozen=True)
class PrunePolicy:
    checks: tuple[float, ...] = (0.3, 0.5, 0.7)  # fractions of the budget where a run is judged
    z: tuple[float, ...] = (5.0, 4.0, 3.5)  # margin in sds of (run − incumbent mean): strict early
    window: float = 0.05  # the loss at f is the median of the curve's points in [f − window, f]
    min_curves: int = 2  # incumbent curves needed to calibrate a spread
    floor_rel: float = 0.01  # the margin is at least this share of the reference loss
    speed_tol: float = 0.15  # a run whose speed so far departs more than this is not judged
    exempt: frozenset[str] = field(default_factory=lambda: frozenset({"data/schedule"}))

    def __post_init__(self) -> None:
        if not self.checks or len(self.z) != len(self.checks):
            raise ValueError(f"prune policy: {len(self.checks)} checks need as many z values, "
                             f"got {len(self.z)}")
        if any(not 0 < f < 1 for f in self.checks) or list(self.checks) != sorted(self.checks):
            raise ValueError(f"prune policy: checks must be increasing fractions in (0, 1), "
                             f"got {self.checks}")
        if any(not z > 0 for z in self.z) or not self.window > 0 or self.min_curves < 2:
            raise ValueError("prune policy: z and window must be positive and min_curves ≥ 2")


@dataclass(frozen=True)
class PruneCall:
    """One check's outcome; ``why`` says why the run goes on, or that it is behind."""

    stop: bool
    fraction: float
    why: str
    loss: float | None = None
    reference: float | None = None
    spread: float | None = None
    margin: float | None = None

    def reason(self) -> str:
        """For a person: ``stopped at 50 % of the budget: loss 3.41 vs the incumbent's 3.12 ±
        0.05 at the same point`` (or why it was not stopped)."""
        at = f"{round(self.fraction * 100)} % of the budget"
        if self.loss is None or self.reference is None:
            return f"not judged at {at}: {self.why}"
        spread = f" ± {_fmt(self.spread)}" if self.spread is not None else ""
        head = "stopped" if self.stop else "went on"
        return (f"{head} at {at}: loss {_fmt(self.loss)} vs the incumbent's "
                f"{_fmt(self.reference)}{spread} at the same point"
                + ("" if self.stop else f" ({self.why})"))


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return str(x)
    if abs(x) < 0.01 or abs(x) >= 1000:
        return f"{x:.3g}"
    return f"{x:.2f}" if abs(x) >= 1 else f"{x:.3f}"


def loss_at(curve: Curve, fraction: float, window: float) -> float | None:
    """The median loss of the points in [fraction − window, fraction]; None if there are none
    (non-finite losses are left out)."""
    lo = fraction - window - 1e-9
    near = [loss for f, loss in curve if lo <= f <= fraction + 1e-9 and math.isfinite(loss)]
    return statistics.median(near) if near else None


def next_check(fraction_now: float, judged: int, policy: PrunePolicy) -> int | None:
    """The index of the check due now (the latest reached, when several were passed at once),
    given that the first ``judged`` checks are done; None when none is due."""
    due = None
    for i in range(judged, len(policy.checks)):
        if fraction_now + 1e-9 >= policy.checks[i]:
            due = i
    return due


def _pooled_sd(columns: Sequence[Sequence[float]]) -> tuple[float, int] | None:
    """The pooled standard deviation of several samples (each a column of curve values at one
    fraction) and its degrees of freedom; None when no column has two values."""
    ss, df = 0.0, 0
    for col in columns:
        if len(col) >= 2:
            ss += statistics.variance(col) * (len(col) - 1)
            df += len(col) - 1
    return (math.sqrt(ss / df), df) if df else None


def check(challenger: Curve, incumbents: Sequence[Curve], index: int,
          policy: PrunePolicy = PrunePolicy(), *, category: str | None = None,
          speed_ratio: float | None = None) -> PruneCall:
    """Judge the run at ``policy.checks[index]``: stop it when its loss there is above the
    incumbent curves' mean by more than the margin (see the module docstring)."""
    fraction = policy.checks[index]
    if category is not None and category in policy.exempt:
        return PruneCall(False, fraction, f"{category} changes are not stopped early "
                                          "(their curves can cross late)")
    if speed_ratio is not None and abs(speed_ratio - 1) > policy.speed_tol:
        return PruneCall(False, fraction, f"its speed so far is {speed_ratio:.2f}× the "
                                          "incumbent's: the curve measures the machine")
    loss = loss_at(challenger, fraction, policy.window)
    if loss is None:
        return PruneCall(False, fraction, "no progress line near this point")
    here = [v for c in incumbents if (v := loss_at(c, fraction, policy.window)) is not None]
    if len(here) < policy.min_curves:
        return PruneCall(False, fraction, f"{len(here)} incumbent curve(s) reach this point; "
                                          f"{policy.min_curves} are needed to calibrate")
    columns = [[v for c in incumbents if (v := loss_at(c, f, policy.window)) is not None]
               for f in policy.checks[: index + 1]]
    pooled = _pooled_sd(columns)
    assert pooled is not None  # the last column has ≥ min_curves ≥ 2 values
    spread = pooled[0]
    reference = statistics.fmean(here)
    margin = max(policy.z[index] * spread * math.sqrt(1 + 1 / len(here)),
                 policy.floor_rel * abs(reference))
    behind = loss - reference > margin
    why = "behind by more than the margin" if behind else "within the margin"
    return PruneCall(behind, fraction, why, loss, reference, spread, margin)
