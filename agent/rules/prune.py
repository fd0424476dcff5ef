"""Early stop of a clearly losing run: its training loss at a fraction of the budget against the
incumbent's runs at the same fraction, with a margin calibrated from their spread.

Pure: the stdlib only. A curve is ``(fraction of the training budget, training loss)`` points in
order (lower loss is better: it is the training loss, whatever the metric's direction). At each
check fraction a run is judged once; it is stopped only when its loss there is above the
incumbent's mean by more than the margin. Guaranteed: ``check`` never stops a run when

- fewer than 2 of the incumbent's curves reach the fraction (no reference level), or their
  spread has fewer than ``min_curves`` − 1 degrees of freedom there (what ``min_curves``
  curves of one commit give; no spread to calibrate from),
- the run has no point in the window ending at the fraction,
- the change's category is exempt (its curves are known to cross: schedule knobs),
- its speed so far departs from the incumbent's by more than ``speed_tol`` (then the curve
  measures the machine, and the comparison beside the incumbent decides, not this rule),
- or it is within the margin.

The spread is the incumbent curves' standard deviation at the check's fraction, pooled with the
earlier check fractions (more degrees of freedom than n − 1 at one point) and with the curves of
the sweep's earlier incumbents (``earlier``: up to ``pool_earlier`` of them, each commit's curves
centred on their own mean at each fraction: seed noise is the script's, not the commit's; so
the new incumbent right after a keep, with its 2 runs, is judged against), taken at its
one-sided upper confidence bound ``spread_upper`` (a few curves often show a spread far too
small); the margin is ``max(z · spread · √(1 + 1/n), floor_rel · |reference|)``: one run
against the mean of the current incumbent's n curves (the reference level is theirs alone).
``futile`` (off unless ``futile_z`` is set) stops a run that is merely
not ahead enough, recorded as "not better".
Not guaranteed: that a change stopped here would have lost at the end (curves that cross late
exist; that is what ``z`` per check and ``exempt`` are for, calibrated by benchmarks/keep_rule.py).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from agent.core.prune_policy import PrunePolicy

__all__ = ["AUTO_FUTILITY", "PruneCall", "PrunePolicy", "check", "futile", "late_crossing",
           "loss_at", "next_check", "reason_fraction"]
Curve = Sequence[tuple[float, float]]
# The keep rule's futility measured with early stopping on the fixed-budget night
# (agent.rules.verdict.Rule.futility, whose default it is; a target's `futility` key): the
# discard bar rises half-way to keep_z at max_runs. Run-level futility (``futile``) stays
# off: on the fixed-budget night it cost more ≥ 3σ gains kept than the targets allow
# (docs/keep-rule.md#early-stop-and-futility-on-a-fixed-budget).
AUTO_FUTILITY = 0.5


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
    futile: bool = False  # stopped by ``futile``: not ahead enough, rather than behind

    def reason(self) -> str:
        """For a person: ``stopped at 50 % of the budget: loss 3.41 vs the incumbent's 3.12 ±
        0.05 at the same point`` (or why it was not stopped)."""
        at = f"{round(self.fraction * 100)} % of the budget"
        if self.loss is None or self.reference is None:
            return f"not judged at {at}: {self.why}"
        spread = f" ± {_fmt(self.spread)}" if self.spread is not None else ""
        head = "stopped" if self.stop else "went on"
        text = (f"{head} at {at}: loss {_fmt(self.loss)} vs the incumbent's "
                f"{_fmt(self.reference)}{spread} at the same point")
        if self.futile:  # futility: verdict.NOT_BETTER with its evidence, never a crash
            return f"not better: {text}, {self.why}"
        return text + ("" if self.stop else f" ({self.why})")


def reason_fraction(text: str | None) -> float | None:
    """The check's fraction a ``PruneCall.reason()`` names ("stopped at 50 % of the budget: …"
    → 0.5); None for any other text."""
    m = _REASON.match(text or "")
    return int(m.group(1)) / 100 if m else None


_REASON = re.compile(r"(?:not better: )?(?:stopped|went on) at (\d+) % of the budget")


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
          speed_ratio: float | None = None, earlier: Sequence[Sequence[Curve]] = ()
          ) -> PruneCall:
    """Judge the run at ``policy.checks[index]``: stop it when its loss there is above the
    incumbent curves' mean by more than the margin (see the module docstring); ``earlier``:
    the curves of the sweep's earlier incumbents, one group per commit, most recent first."""
    got = _compare(challenger, incumbents, index, policy, category, speed_ratio, earlier)
    if isinstance(got, PruneCall):
        return got
    fraction, loss, reference, spread, n = got
    margin = max(policy.z[index] * spread * math.sqrt(1 + 1 / n),
                 policy.floor_rel * abs(reference))
    behind = loss - reference > margin
    why = "behind by more than the margin" if behind else "within the margin"
    return PruneCall(behind, fraction, why, loss, reference, spread, margin)


def futile(challenger: Curve, incumbents: Sequence[Curve], index: int,
           policy: PrunePolicy = PrunePolicy(), *, category: str | None = None,
           speed_ratio: float | None = None, earlier: Sequence[Sequence[Curve]] = ()
           ) -> PruneCall:
    """Futility at ``policy.checks[index]``: stop a run whose loss there is above the incumbent
    curves' mean by more than ``futile_z[index] · spread · √(1 + 1/n)`` (no floor): not
    clearly losing, but unlikely to end significantly better; the change is "not better",
    never a crash. Never stops when ``futile_z`` is None, nor where ``check`` would not judge
    (too few incumbent curves, no point in the window, an exempt category, a departed speed).
    The call's ``futile`` is True when it stops."""
    fraction = policy.checks[index]
    if policy.futile_z is None:
        return PruneCall(False, fraction, "futility is off")
    got = _compare(challenger, incumbents, index, policy, category, speed_ratio, earlier)
    if isinstance(got, PruneCall):
        return got
    fraction, loss, reference, spread, n = got
    margin = policy.futile_z[index] * spread * math.sqrt(1 + 1 / n)
    hopeless = loss - reference > margin
    why = ("not ahead enough to end significantly better" if hopeless
           else "ahead enough to go on")
    return PruneCall(hopeless, fraction, why, loss, reference, spread, margin, futile=hopeless)


def late_crossing(challenger: Curve, incumbents: Sequence[Curve], policy: PrunePolicy,
                  *, ended_better: bool, earlier: Sequence[Sequence[Curve]] = ()
                  ) -> PruneCall | None:
    """For a run that trained to the end: the first check at which it was behind by more than
    the margin (judged as if its category were not exempt and its speed had not departed),
    when it nonetheless ended better than the incumbent; None otherwise. A category whose
    changes show one crosses late: a night can exempt it from then on (learned, not declared)."""
    if not ended_better:
        return None
    for index in range(len(policy.checks)):
        call = check(challenger, incumbents, index, policy, earlier=earlier)
        if call.stop:
            return call
    return None


def _compare(challenger: Curve, incumbents: Sequence[Curve], index: int, policy: PrunePolicy,
             category: str | None, speed_ratio: float | None,
             earlier: Sequence[Sequence[Curve]] = ()
             ) -> PruneCall | tuple[float, float, float, float, int]:
    """(fraction, loss, reference, spread, n) of a run that can be judged at the check, or
    the call that says why it cannot."""
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
    here = _column(incumbents, fraction, policy.window)
    groups = [incumbents, *earlier[: policy.pool_earlier]]
    df = sum(max(len(_column(g, fraction, policy.window)) - 1, 0) for g in groups)
    if len(here) < 2 or df < policy.min_curves - 1:
        return PruneCall(False, fraction, _too_few(len(here), df, len(groups) > 1, policy))
    columns = [_column(g, f, policy.window) for f in policy.checks[: index + 1] for g in groups]
    pooled = _pooled_sd(columns)
    assert pooled is not None  # df ≥ min_curves − 1 ≥ 1
    spread = pooled[0] * _upper(pooled[1], policy.spread_upper)
    return fraction, loss, statistics.fmean(here), spread, len(here)


def _too_few(n: int, df: int, pooled: bool, policy: PrunePolicy) -> str:
    if not pooled:
        return (f"{n} incumbent curve(s) reach this point; {policy.min_curves} are needed to "
                "calibrate")
    return (f"{n} incumbent curve(s) reach this point, {df} degree(s) of freedom with the "
            f"earlier incumbents'; 2 curves and {policy.min_curves - 1} are needed to calibrate")


def _column(curves: Sequence[Curve], fraction: float, window: float) -> list[float]:
    """The curves' losses at `fraction` (those that reach it)."""
    return [v for c in curves if (v := loss_at(c, fraction, window)) is not None]


def _upper(df: int, level: float) -> float:
    """sd_upper / sd: the one-sided upper confidence bound of a standard deviation with `df`
    degrees of freedom, √(df / χ²_{1 − level}(df)) (Wilson–Hilferty's χ² quantile); 1 at 0."""
    if level <= 0:
        return 1.0
    z = statistics.NormalDist().inv_cdf(1 - level)
    q = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return math.sqrt(df / max(q, 1e-9))
