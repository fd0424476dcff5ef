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


def squares(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """(Σ squared deviations from each group's mean, degrees of freedom) over the groups."""
    ss, df = 0.0, 0
    for g in groups:
        if len(g) >= 2:
            m = sum(g) / len(g)
            ss += sum((v - m) ** 2 for v in g)
            df += len(g) - 1
    return ss, df


def pooled_sigma(
    groups: Sequence[Sequence[float]], prior: tuple[float, int] = (0.0, 0)
) -> tuple[float | None, int]:
    """Pooled within-group standard deviation and its degrees of freedom.

    Every group with at least two values contributes (n − 1) degrees of freedom; one run of a
    commit says nothing about noise. `prior` is squares() of groups already summed elsewhere.
    (None, 0) when nothing has two values.
    """
    return pooled_of(((group_squares(g), len(g) - 1) for g in groups if len(g) >= 2), prior)


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


def _deviates(value: float, reference: float, tolerance: float) -> bool:
    return reference > 0 and abs(value - reference) / reference > tolerance


def suspect_flags(
    throughputs: Sequence[float | None],
    incumbent: Sequence[float | None],
    tolerance: float,
) -> list[bool]:
    """Which runs measured the machine rather than the change.

    A run is suspect when its throughput deviates by more than `tolerance` (a share) from the
    incumbent's median *and* from the median of the same commit's other runs — so a change that
    really alters throughput is believed once two of its runs agree, while one run that ran
    unusually fast or slow is re-run. A run without a throughput is never suspect.
    """
    ref_values = [t for t in incumbent if t is not None]
    ref = median(ref_values) if ref_values else None
    flags = []
    for i, value in enumerate(throughputs):
        others = [t for j, t in enumerate(throughputs) if j != i and t is not None]
        refs = [r for r in (ref, median(others) if others else None) if r is not None]
        flags.append(
            value is not None and bool(refs) and all(_deviates(value, r, tolerance) for r in refs)
        )
    return flags


def throughput(summary: dict[str, float | str]) -> tuple[float | None, str | None]:
    """Tokens/s (or steps/s) of one run from its summary block; (None, None) when unknown."""
    seconds = summary.get("training_seconds")
    if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds <= 0:
        return None, None
    for key, scale, unit in (("total_tokens_M", 1e6, "tokens/s"), ("num_steps", 1.0, "steps/s")):
        value = summary.get(key)
        if isinstance(value, int | float) and math.isfinite(value) and value > 0:
            return value * scale / seconds, unit
    return None, None
