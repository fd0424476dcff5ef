"""The early stop: a futility boundary beside the keep rule's test, taken at a fraction of the
budget on the training loss (docs/keep-rule.md#the-early-stop): behind at P(T ≤ t) ≤ the level
(agent.rules.decide.stop_level) and not catching up (`catching_up`). Pure: the stdlib, the
policy and agent.rules.noise only. A curve is ``(fraction of the budget, training loss)``
points, lower is better whatever the metric's direction. Curves are compared at matched points:
each is read, on the monotone cubic through its points, at every 1/GRID of the budget in the
part that all of them reach, so runs whose progress lines fall at other steps measure the same
thing (the engine places every curve by the judged run's own steps first,
agent.engine.early_stop.placer, so that on a time budget the machine's pace moves no loss
either). Not guaranteed: that a stopped change would have lost at the end.
"""
from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from agent.core.prune_policy import PrunePolicy
from agent.rules.noise import pooled_of, squared_deviations, t_score, t_sf

__all__ = ["GRID", "PruneCall", "PrunePolicy", "catching_up", "check", "loss_at", "loss_over",
           "matched", "next_check", "upto"]
Curve = Sequence[tuple[float, float]]
GRID = 200  # the matched points: every 1/GRID of the budget (a run's curve is recorded so)


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


def loss_at(curve: Curve, fractions: Sequence[float]) -> list[float | None]:
    """The curve's loss at each of the `fractions` (non-finite losses left out), on the monotone
    cubic through its points (Fritsch–Carlson: no overshoot, exact at each point, and on a
    steep, bending stretch far closer to the curve between sparse lines than a straight line);
    None before its first point or past its last."""
    points = [(f, loss) for f, loss in curve if math.isfinite(loss)]
    if any(points[i][0] > points[i + 1][0] for i in range(len(points) - 1)):
        points.sort()
    xs = [f for f, _ in points]
    slopes = _slopes(points)
    out: list[float | None] = []
    for x in fractions:
        j = bisect.bisect_left(xs, x - 1e-9)  # the first point at or past x
        if j == len(xs) or (j == 0 and xs[0] > x + 1e-9):
            out.append(None)
        elif xs[j] <= x + 1e-9:
            out.append(points[j][1])
        else:
            (f0, v0), (f1, v1) = points[j - 1], points[j]
            h, t = f1 - f0, (x - f0) / (f1 - f0)
            out.append((2 * t**3 - 3 * t**2 + 1) * v0 + (t**3 - 2 * t**2 + t) * h * slopes[j - 1]
                       + (-2 * t**3 + 3 * t**2) * v1 + (t**3 - t**2) * h * slopes[j])
    return out


def _slopes(points: Sequence[tuple[float, float]]) -> list[float]:
    """Fritsch–Carlson tangents, as scipy's PchipInterpolator has them: inside, the weighted
    harmonic mean of the secants on either side (0 where they differ in sign, so a monotone
    stretch stays monotone); at the ends a three-point estimate kept from overshooting."""
    n = len(points)
    if n < 2:
        return [0.0] * n
    h = [max(points[i + 1][0] - points[i][0], 1e-12) for i in range(n - 1)]
    m = [(points[i + 1][1] - points[i][1]) / h[i] for i in range(n - 1)]
    if n == 2:
        return [m[0], m[0]]
    out = [_end(h[0], h[1], m[0], m[1])]
    for i in range(1, n - 1):
        a, b = m[i - 1], m[i]
        if a * b <= 0:
            out.append(0.0)
            continue
        w0, w1 = 2 * h[i] + h[i - 1], h[i] + 2 * h[i - 1]
        out.append((w0 + w1) / (w0 / a + w1 / b))
    out.append(_end(h[-1], h[-2], m[-1], m[-2]))
    return out


def _end(h0: float, h1: float, m0: float, m1: float) -> float:
    """An end's tangent from its two secants (m0 the end's own), shape-preserving."""
    d = ((2 * h0 + h1) * m0 - h0 * m1) / (h0 + h1)
    if math.copysign(1, d) != math.copysign(1, m0) or d == 0:
        return 0.0
    if math.copysign(1, m0) != math.copysign(1, m1) and abs(d) > 3 * abs(m0):
        return 3 * m0
    return d


@dataclass(frozen=True)
class Matched:
    """A run's and the reference curves' median losses over a part at the same points."""

    loss: float | None  # the run's; None when it shares no point with them there
    incumbents: list[float]  # the incumbent's curves that reach the part's end
    earlier: list[list[float]]  # per earlier group, its curves that reach every point


def matched(run: Curve, incumbents: Sequence[Curve], part: tuple[float, float],
            earlier: Sequence[Sequence[Curve]] = ()) -> Matched:
    """Each curve's median loss over `part` at matched points: every 1/GRID of the budget in
    (start, end] (the first part from the run's start) that the run and each incumbent curve
    reaching the part's end all reach, so runs whose progress lines fall at other steps are
    read at the same ones. An earlier curve that misses one of those points is left out. Every
    curve is read only as far as the run has got (`upto`)."""
    start, end = max(part[0], 0.0), part[1]
    grid = [i / GRID for i in range(math.floor(start * GRID + 1e-6) + 1,
                                    math.floor(end * GRID + 1e-6) + 1)]
    last = max((f for f, loss in run if math.isfinite(loss)), default=None)
    if last is not None:  # every curve read as far as the run has got: its end reads alike
        incumbents = [upto(c, last) for c in incumbents]
        earlier = [[upto(c, last) for c in g] for g in earlier]
    reach = [row for c in incumbents if grid and (row := loss_at(c, grid))[-1] is not None]
    mine = loss_at(run, grid)
    keep = [i for i, v in enumerate(mine)
            if v is not None and all(row[i] is not None for row in reach)]
    if not keep:
        return Matched(None, [], [])
    points = [grid[i] for i in keep]

    def median(row: Sequence[float | None]) -> list[float]:
        """[the median of the row's values at the points], or [] when it misses one."""
        here = [v for v in row if v is not None]
        return [statistics.median(here)] if len(here) == len(row) else []

    theirs = [m for row in reach for m in median([row[i] for i in keep])]
    before = [[m for c in g for m in median(loss_at(c, points))] for g in earlier]
    return Matched(median([mine[i] for i in keep])[0], theirs, before)


def upto(curve: Curve, last: float) -> list[tuple[float, float]]:
    """The curve's points up to `last`, and its first point past it when none is at it: read
    only so far, a curve's cubic near `last` is drawn as the judged run's is (its last line
    has one neighbour, not two), so a curve with the same lines reads the same."""
    points = sorted((f, loss) for f, loss in curve if math.isfinite(loss))
    out = [p for p in points if p[0] <= last + 1e-9]
    if not out or out[-1][0] < last - 1e-9:
        out += [p for p in points if p[0] > last + 1e-9][:1]
    return out


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
    """Judge the run at ``policy.checks[index]``: its median loss over the part of the budget since
    the check before against the mean of the incumbent's curves' medians, at matched points
    (`matched`), the spread pooled with ``earlier`` (the earlier incumbents' curves, one group
    per commit), on Student's t; stopped when worse with P(T ≤ t) ≤ ``level``, unless its gap
    fell by more than the standard error from the part's first half to its second
    (`catching_up`: such a curve can cross late). Not judged: an exempt category, ``speed_off``
    (its speed so far is off the incumbent's), no point in the part, curves with no spread."""
    fraction = policy.checks[index]
    if category is not None and category in policy.exempt:
        return PruneCall(False, fraction, f"{category} changes are not stopped early "
                                          "(their curves can cross late)")
    if speed_off:
        return PruneCall(False, fraction, "its speed so far differs from the incumbent's, so "
                                          "its loss curve measures the machine")
    part = policy.part(index)
    m = matched(challenger, incumbents, part, earlier)
    if m.loss is None:
        return PruneCall(False, fraction, "no progress line since the check before")
    sd, df = pooled_of([squared_deviations([m.incumbents, *m.earlier])])
    if not m.incumbents or sd is None:
        return PruneCall(False, fraction, "the incumbent's curves show no spread here yet")
    reference = statistics.fmean(m.incumbents)
    se = sd * math.sqrt(1 + 1 / len(m.incumbents))
    p_worse = 1.0 - t_sf(t_score(reference - m.loss, se), df)
    stop = p_worse <= level
    why = "clearly behind" if stop else f"not clearly behind (P {p_worse:.2g} > {level:.2g})"
    if stop and (closing := catching_up(challenger, incumbents, part)) is not None:
        first, second = closing
        if first - second > se:
            stop = False
            why = (f"behind but catching up: {_fmt(first)} behind over the part's first half, "
                   f"{_fmt(second)} over its second")
    return PruneCall(stop, fraction, why, m.loss, reference, se, p_worse, max(part[0], 0.0))


def catching_up(run: Curve, incumbents: Sequence[Curve],
                part: tuple[float, float]) -> tuple[float, float] | None:
    """How far the run is behind the incumbent's mean over the first and the second half of
    `part` (each at matched points, as `matched`); None when a half has no point. A run whose
    gap fell by more than the check's standard error within the part is catching up (a lower
    learning rate: behind from its start, level by the end), which the model excludes."""
    start, end = max(part[0], 0.0), part[1]
    mid = (start + end) / 2
    gaps = []
    for half in ((start, mid), (mid, end)):
        m = matched(run, incumbents, half)
        if m.loss is None or not m.incumbents:
            return None
        gaps.append(m.loss - statistics.fmean(m.incumbents))
    return gaps[0], gaps[1]
