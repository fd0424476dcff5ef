"""A change's gain over its incumbent within the machine's conditions, with a noise that sees
drift: the estimate, its standard error, and σ̂ from runs back to back and spread in time.

Pure: the stdlib and agent.rules.noise only. Two σ's: σ_b, from runs that ran back to back
(a change's repeats, the incumbent's runs beside them, the sweep's other changes), and σ_d,
from the incumbent's runs spread over the night within one condition (its older runs). When
σ_d is clearly larger the machine drifts more slowly than back-to-back repeats can see, and a
change's repeats, run together, share one offset of that drift: comparing them with older
runs then has variance σ_d²·(1 + 1/m) − σ_b²·(1 − 1/n) (n change runs, m incumbent runs),
which is σ²(1/n + 1/m) when nothing drifts. Runs beside the change are compared with σ_b.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agent.rules.noise import pooled_sigma

SPLIT_Z = 2.5  # incumbent runs beside the change this many standard errors off its older ones
DRIFT_SD = 2.0  # σ_d² this many sampling SDs above σ_b² (χ²: √(2/df)) says the machine drifts
MIN_DF = 4  # degrees of freedom of σ_b before a drift can be told from its own noise


@dataclass(frozen=True)
class Stratum:
    """One condition with runs of the change and of the incumbent."""

    key: tuple[str | None, int]
    change: tuple[float, ...]
    beside: tuple[float, ...]  # the incumbent's runs started beside the change's
    older: tuple[float, ...]  # its other runs in this condition
    beside_ids: tuple[int, ...]

    def incumbent(self, sigma: float | None) -> tuple[float, ...]:
        """What the change is compared with here: every incumbent run of the condition,
        or only those beside it when they disagree with the older ones (a shift the
        throughput did not show)."""
        if not self.beside or not self.older or not sigma:
            return self.beside + self.older
        gap = abs(sum(self.beside) / len(self.beside) - sum(self.older) / len(self.older))
        se = sigma * math.sqrt(1 / len(self.beside) + 1 / len(self.older))
        return self.beside if gap > SPLIT_Z * se else self.beside + self.older


@dataclass(frozen=True)
class Noise:
    sigma: float | None  # σ_b: back to back (what the sweep reports as σ̂)
    df: int
    drift: float | None = None  # σ_d when the incumbent's spread runs show drift, else None


def noise(back_to_back: Sequence[Sequence[float]], spread: Sequence[Sequence[float]],
          prior: tuple[float, int] = (0.0, 0)) -> Noise:
    """The pooled σ of every group (and `prior`, the other commits' squares); when the
    spread groups' σ is clearly above the back-to-back one (both with enough degrees of
    freedom to tell), σ_b and the drift σ_d instead."""
    sigma, df = pooled_sigma([*back_to_back, *spread], prior=prior)
    b, b_df = pooled_sigma(back_to_back, prior=prior)
    d, d_df = pooled_sigma(spread)
    if b is None or d is None or b_df < MIN_DF or d_df < 2:
        return Noise(sigma, df)
    clearly = b * b * (1 + DRIFT_SD * math.sqrt(2 / d_df + 2 / b_df))
    return Noise(b, df, d) if d * d > clearly else Noise(sigma, df)


def estimate(strata: Sequence[Stratum], n: Noise, sign: float) -> tuple[float, float] | None:
    """(gain, its standard error) over the conditions, better = positive: the inverse-
    variance mean of each condition's (incumbent mean − change mean)·sign. The standard error
    is 0 when σ is; None when there is no condition or no σ."""
    if n.sigma is None:
        return None
    total = weight = 0.0
    for s in strata:
        inc = s.incumbent(n.sigma)
        var = _variance(s, inc, n)
        gain = sign * (sum(inc) / len(inc) - sum(s.change) / len(s.change))
        if var <= 0:
            return gain, 0.0
        total += gain / var
        weight += 1 / var
    if not weight:
        return None
    return total / weight, math.sqrt(1 / weight)


def _variance(s: Stratum, inc: Sequence[float], n: Noise) -> float:
    b = n.sigma or 0.0
    k, m = len(s.change), len(inc)
    if n.drift is None or len(inc) == len(s.beside):  # only runs beside it: no drift between
        return b * b * (1 / k + 1 / m)
    d = n.drift
    return d * d * (1 + 1 / m) - b * b * (1 - 1 / k)


def gain_only(strata: Sequence[Stratum], sign: float) -> float | None:
    """The gain with equal weights per run, for when no σ is known."""
    if not strata:
        return None
    total = weight = 0.0
    for s in strata:
        inc = s.incumbent(None)
        w = 1.0 / (1.0 / len(s.change) + 1.0 / len(inc))
        total += w * sign * (sum(inc) / len(inc) - sum(s.change) / len(s.change))
        weight += w
    return total / weight
