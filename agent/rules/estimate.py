"""A change's gain over its incumbent within the machine's conditions: the estimate, its
standard error, and σ̂ from runs back to back and spread in time, the speed taken out where the
metric follows it.

Pure: the stdlib and agent.rules.noise only.

Two σ's: σ_b, from runs that ran back to back (a change's repeats, the incumbent's runs beside
them, the sweep's other changes), and σ_d, from the incumbent's runs spread over the night
within one condition (its older runs). When σ_d is clearly larger the machine drifts more
slowly than back-to-back repeats can see, and a change's repeats, run together, share one
offset of that drift: comparing them with older runs then has variance
σ_d²·(1 + 1/m) − σ_b²·(1 − 1/n) (n change runs, m incumbent runs), which is σ²(1/n + 1/m) when
nothing drifts. Runs beside the change are compared with σ_b.

The speed: on a time budget a run that got more of a shared machine trains more steps, so even
within one condition the metric may follow the throughput. The slope β of the metric on log
throughput within the back-to-back groups (one commit, one stretch of time: all the speed
difference is the machine's) is used when it is clearly there (Student's t at 1 %): runs are then
compared at the incumbent's speed, gain = sign·((ȳ_inc − ȳ_change) − β·(l̄_inc − l̄_change)),
l = log throughput; σ̂ keeps the speed-driven spread. A change whose own speed was credited (the
incumbent beside it kept its usual speed, and its next run kept its new one) keeps what its
speed bought: no adjustment there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agent.rules.noise import pooled_sigma

Obs = tuple[float, float | None]  # (metric, log throughput or None)
SPLIT_Z = 2.5  # incumbent runs beside the change this many standard errors off its older ones
DRIFT_SD = 6.0  # σ_d² this many sampling SDs above σ_b² (χ²: √(2/df)) says the machine drifts
MIN_DF = 4  # degrees of freedom of σ_b before a drift can be told from its own noise
# The metric follows the speed when β is this far from 0: Student's t at a two-sided 1 %, by
# degrees of freedom (a slope fitted on few runs must be very clear to be believed).
SLOPE_T = ((2, 9.92), (3, 5.84), (4, 4.6), (5, 4.03), (6, 3.71), (8, 3.36), (10, 3.17),
           (15, 2.95), (20, 2.85), (30, 2.75), (60, 2.66))


@dataclass(frozen=True)
class Stratum:
    """One condition with runs of the change and of the incumbent."""

    key: tuple[str | None, int]
    change: tuple[Obs, ...]
    beside: tuple[Obs, ...]  # the incumbent's runs started beside the change's
    older: tuple[Obs, ...]  # its other runs in this condition
    beside_ids: tuple[int, ...]
    usual: bool = True  # the incumbent's usual conditions on its device
    credited: bool = False  # the change's own speed here (confirmed): not adjusted

    def incumbent(self, sigma: float | None, beta: float = 0.0) -> tuple[Obs, ...]:
        """What the change is compared with here: every incumbent run of the condition,
        or only those beside it when they disagree with the older ones (a shift the
        throughput did not show)."""
        if not self.beside or not self.older or not sigma:
            return self.beside + self.older
        gap = abs(_gap(self.beside, self.older, beta))
        se = sigma * math.sqrt(1 / len(self.beside) + 1 / len(self.older))
        return self.beside if gap > SPLIT_Z * se else self.beside + self.older


@dataclass(frozen=True)
class Noise:
    sigma: float | None  # σ_b: back to back (what the sweep reports as σ̂)
    df: int
    drift: float | None = None  # σ_d when the incumbent's spread runs show drift, else None
    beta: float = 0.0  # the metric's slope on log throughput (0: it does not follow it)


def values(groups: Sequence[Sequence[Obs]]) -> list[list[float]]:
    return [[y for y, _ in g] for g in groups]


def _means(obs: Sequence[Obs]) -> tuple[float, float | None]:
    y = sum(o[0] for o in obs) / len(obs)
    logs = [o[1] for o in obs]
    known = [v for v in logs if v is not None]
    return y, (sum(known) / len(known) if len(known) == len(logs) else None)


def _gap(a: Sequence[Obs], b: Sequence[Obs], beta: float) -> float:
    """mean(a) − mean(b), at equal speed when β is known."""
    (ya, la), (yb, lb) = _means(a), _means(b)
    if not beta or la is None or lb is None:
        return ya - yb
    return ya - yb - beta * (la - lb)


def slope(groups: Sequence[Sequence[Obs]]) -> float:
    """β, when the metric clearly follows log throughput within these groups, else 0."""
    sxy = sxx = syy = 0.0
    df = -1
    for g in groups:
        pts = [(y, v) for y, v in g if v is not None]
        if len(pts) < 2:
            continue
        ym = sum(y for y, _ in pts) / len(pts)
        lm = sum(v for _, v in pts) / len(pts)
        sxy += sum((v - lm) * (y - ym) for y, v in pts)
        sxx += sum((v - lm) ** 2 for _, v in pts)
        syy += sum((y - ym) ** 2 for y, _ in pts)
        df += len(pts) - 1
    if df < SLOPE_T[0][0] or sxx <= 0:
        return 0.0
    beta = sxy / sxx
    resid = max(syy - beta * sxy, 0.0) / df
    if resid == 0:
        return beta
    return beta if abs(beta) / math.sqrt(resid / sxx) >= _t_crit(df) else 0.0


def _t_crit(df: int) -> float:
    for at_most, t in SLOPE_T:
        if df <= at_most:
            return t
    return 2.58


def noise(back_to_back: Sequence[Sequence[Obs]], spread: Sequence[Sequence[Obs]],
          prior: tuple[float, int] = (0.0, 0)) -> Noise:
    """The pooled σ of every group (and `prior`, the other commits' squares) and the speed's
    slope β; when the spread groups' σ is clearly above the back-to-back one (both with
    enough degrees of freedom to tell), σ_b and the drift σ_d instead. σ̂ keeps the
    speed-driven spread (β only moves the means): a slope fitted on a few runs is no licence
    to claim less noise."""
    beta = slope([*back_to_back, *spread])
    together, apart = values(back_to_back), values(spread)
    sigma, df = pooled_sigma([*together, *apart], prior=prior)
    b, b_df = pooled_sigma(together, prior=prior)
    d, d_df = pooled_sigma(apart)
    if b is None or d is None or b_df < MIN_DF or d_df < 2:
        return Noise(sigma, df, beta=beta)
    clearly = b * b * (1 + DRIFT_SD * math.sqrt(2 / d_df + 2 / b_df))
    return Noise(b, df, d, beta) if d * d > clearly else Noise(sigma, df, beta=beta)


def estimate(strata: Sequence[Stratum], n: Noise, sign: float) -> tuple[float, float] | None:
    """(gain, its standard error) over the conditions, better = positive: the inverse-
    variance mean of each condition's gain (see the module docstring). The standard error is
    0 when σ is; None when there is no condition or no σ."""
    if n.sigma is None:
        return None
    total = weight = 0.0
    for s in strata:
        inc = s.incumbent(n.sigma, n.beta)
        var = _variance(s, inc, n)
        gain = sign * _gap(inc, s.change, 0.0 if s.credited else n.beta)
        if var <= 0:
            return gain, 0.0
        total += gain / var
        weight += 1 / var
    if not weight:
        return None
    return total / weight, math.sqrt(1 / weight)


def _variance(s: Stratum, inc: Sequence[Obs], n: Noise) -> float:
    b = n.sigma or 0.0
    k, m = len(s.change), len(inc)
    if n.drift is None or len(inc) == len(s.beside):  # only runs beside it: no drift between
        return b * b * (1 / k + 1 / m)
    d = n.drift
    return d * d * (1 + 1 / m) - b * b * (1 - 1 / k)


def gain_only(strata: Sequence[Stratum], sign: float, beta: float = 0.0) -> float | None:
    """The gain with equal weights per run, for when no σ is known."""
    if not strata:
        return None
    total = weight = 0.0
    for s in strata:
        inc = s.incumbent(None)
        w = 1.0 / (1.0 / len(s.change) + 1.0 / len(inc))
        total += w * sign * _gap(inc, s.change, 0.0 if s.credited else beta)
        weight += w
    return total / weight
