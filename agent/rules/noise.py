"""Run-to-run noise arithmetic for the keep rule: means, pooled σ, z, P(better), suspect runs.

Pure: stdlib only. Every function takes plain numbers and returns plain numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from statistics import NormalDist, median

_NORMAL = NormalDist()


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def sample_sd(values: Sequence[float]) -> float | None:
    """The sample standard deviation (n − 1); None under two values."""
    if len(values) < 2:
        return None
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def informative(g: Sequence[float]) -> bool:
    """Does this group of one commit's runs say anything about the noise? Two runs or more,
    not all identical: identical repeats (a script that ignores OVERNIGHT_SEED, or one seed
    run twice) are not evidence of zero noise."""
    return len(g) >= 2 and any(v != g[0] for v in g)


def identical(groups: Iterable[Sequence[float]]) -> bool:
    """Some group of two runs or more whose metrics are all the same."""
    return any(len(g) >= 2 and not informative(g) for g in groups)


def squares(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """(Σ squared deviations from each group's mean, degrees of freedom) over the informative
    groups."""
    ss, df = 0.0, 0
    for g in groups:
        if informative(g):
            m = sum(g) / len(g)
            ss += sum((v - m) ** 2 for v in g)
            df += len(g) - 1
    return ss, df


def pooled_sigma(
    groups: Sequence[Sequence[float]], prior: tuple[float, int] = (0.0, 0)
) -> tuple[float | None, int]:
    """Pooled within-group standard deviation and its degrees of freedom.

    Every informative group (two values or more, not all identical) contributes (n − 1)
    degrees of freedom; one run of a commit says nothing about noise, nor do identical repeats.
    `prior` is squares() of groups already summed elsewhere. (None, 0) when no group informs.
    """
    return pooled_of(((group_squares(g), len(g) - 1) for g in groups if informative(g)), prior)


def group_squares(g: Sequence[float]) -> float:
    """Σ squared deviations of a group's values from its mean."""
    m = sum(g) / len(g)
    return sum((v - m) ** 2 for v in g)


def pooled_of(parts: Iterable[tuple[float, int]], prior: tuple[float, int] = (0.0, 0)
              ) -> tuple[float | None, int]:
    """pooled_sigma from each group's (group_squares, n − 1), in the groups' order."""
    ss, df = prior
    for group_ss, group_df in parts:
        ss += group_ss
        df += group_df
    return (math.sqrt(ss / df), df) if df else (None, 0)


def z_score(gain: float, sigma: float, n_change: int, n_best: int) -> float:
    """gain / (σ·√(1/n_change + 1/n_best)); ±inf when σ is 0 (a noise-free metric), 0 at 0."""
    se = sigma * math.sqrt(1.0 / n_change + 1.0 / n_best)
    if se > 0:
        return gain / se
    if gain == 0:
        return 0.0
    return math.copysign(math.inf, gain)


def p_better(z: float) -> float:
    """P(the change is really better) under a normal approximation: Φ(z)."""
    return _NORMAL.cdf(z) if math.isfinite(z) else (1.0 if z > 0 else 0.0)


def ci95(values: Sequence[float], sigma: float | None = None) -> float | None:
    """Half-width of the 95 % interval of the mean: 1.96·σ/√n (σ̂ of the sweep when given)."""
    s = sigma if sigma is not None else sample_sd(values)
    if s is None or not values:
        return None
    return 1.96 * s / math.sqrt(len(values))


SPEED_Z = 4.0  # a throughput this many run-to-run σ off says the machine (or the change) moved
SPEED_TOLERANCE = (0.05, 0.3)  # the measured tolerance's floor and cap
SPEED_UNMEASURED = 0.1  # the tolerance before two runs of one commit ran back to back
_MEDIAN_CHI2_1 = 0.454936  # the median of a χ² with one degree of freedom


def speed_noise(rows: Sequence[tuple[str, str | None, float | None]]) -> float | None:
    """The run-to-run σ of log throughput, from runs that ran back to back: (commit, device,
    throughput) in start order, each adjacent pair of the same commit on the same device.
    Robust (the median squared log ratio), so a pair that straddled a change of load barely
    moves it. None under two such pairs."""
    squares = [math.log(b[2] / a[2]) ** 2 for a, b in zip(rows, rows[1:], strict=False)
               if a[0] == b[0] and a[1] == b[1] and a[2] and b[2] and a[2] > 0 and b[2] > 0]
    if len(squares) < 2:
        return None
    return math.sqrt(median(squares) / _MEDIAN_CHI2_1 / 2.0)


def speed_tolerance(noise: float | None) -> float:
    """How far (a share) a run's throughput may be off before the keep rule asks whether the
    machine moved: SPEED_Z run-to-run σ, within SPEED_TOLERANCE."""
    if noise is None:
        return SPEED_UNMEASURED
    low, high = SPEED_TOLERANCE
    return min(high, max(low, math.expm1(SPEED_Z * noise)))
