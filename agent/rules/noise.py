"""Run-to-run noise arithmetic: means, the pooled σ̂ with its degrees of freedom, Student's t,
and the spread of the machine's speed.

Pure: stdlib only. Every function takes plain numbers and returns plain numbers. Student's t
is computed here (the regularised incomplete beta function by its continued fraction) so the
service needs no scipy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from statistics import NormalDist, median

_NORMAL = NormalDist()


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def group_squares(g: Sequence[float]) -> float:
    """Σ squared deviations of a group's values from its mean."""
    m = sum(g) / len(g)
    return sum((v - m) ** 2 for v in g)


def measures_noise(g: Sequence[float]) -> bool:
    """Whether a commit's runs measure the noise: two or more, not all identical (identical
    repeats, a script that ignores OVERNIGHT_SEED, are no evidence of zero noise)."""
    return len(g) >= 2 and any(v != g[0] for v in g)


def squared_deviations(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """(Σ squared deviations from each group's mean, degrees of freedom) over the informative
    groups."""
    measured = [g for g in groups if measures_noise(g)]
    return sum(map(group_squares, measured)), sum(len(g) - 1 for g in measured)


def pooled_of(parts: Iterable[tuple[float, int]], prior: tuple[float, int] = (0.0, 0)
              ) -> tuple[float | None, int]:
    """The pooled standard deviation of groups given as (squares, n − 1), and its degrees of
    freedom; (None, 0) when there are none."""
    ss, df = map(sum, zip(prior, *parts, strict=True))
    return (math.sqrt(ss / df), int(df)) if df else (None, 0)


def t_score(gain: float, se: float) -> float:
    """gain / its standard error; ±inf when that is 0, 0 at 0."""
    if se > 0:
        return gain / se
    return 0.0 if gain == 0 else math.copysign(math.inf, gain)


def t_sf(t: float, df: float | None) -> float:
    """P(T ≥ t) for Student's t with `df` degrees of freedom (the normal when df is None)."""
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    if df is None:
        return 1.0 - _NORMAL.cdf(t)
    tail = 0.5 * _beta_inc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


def _beta_inc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) (Lentz's continued fraction)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _beta_inc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x)) / a
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
        c = 1.0 + num / (c if abs(c) > 1e-300 else 1e-300)
        f *= c * d
        if abs(1.0 - c * d) < 1e-14:
            break
    return front * (f - 1.0)


SPEED_Z = 4.0  # a throughput this many run-to-run σ off says the machine (or the change) moved
SPEED_TOLERANCE = (0.05, 0.3)  # the measured tolerance's floor and cap
_MEDIAN_CHI2_1 = 0.454936  # the median of a χ² with one degree of freedom


def speed_noise(rows: Sequence[tuple[str, str | None, float | None]]) -> float | None:
    """The run-to-run σ of log throughput, from runs that ran back to back: (commit, device,
    throughput) in start order, each adjacent pair of the same commit on the same device.
    Robust (the median squared log ratio), so a pair that straddled a change of load barely
    moves it. None under two such pairs."""
    sq = [math.log(b[2] / a[2]) ** 2 for a, b in zip(rows, rows[1:], strict=False)
          if a[0] == b[0] and a[1] == b[1] and a[2] and b[2] and a[2] > 0 and b[2] > 0]
    if len(sq) < 2:
        return None
    return math.sqrt(median(sq) / _MEDIAN_CHI2_1 / 2.0)


def speed_tolerance(noise: float | None, time_budget: bool = True) -> float:
    """How far (a share) a run's throughput may be off a condition's and still be in it:
    SPEED_Z run-to-run σ, within SPEED_TOLERANCE (its cap before σ is measured). On a compute
    budget the speed does not change what a run trains: any speed agrees (one condition)."""
    if not time_budget:
        return math.inf
    low, high = SPEED_TOLERANCE
    return high if noise is None else min(high, max(low, math.expm1(SPEED_Z * noise)))
