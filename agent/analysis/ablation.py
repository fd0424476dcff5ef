"""Leave-one-out attribution of a night's gain: what each kept change is worth on top of the
others, with a 95 % interval, and the changes that interact (help only with a later change,
help less than when kept, or no longer help at all).

Pure: stdlib, config's Direction and agent.rules.noise. The input is the runs of an ablation
sweep's variants (`overnight finalize --ablate`): the best (every kept change), the baseline
(none) and the best minus each kept change, k seeds each, the same seeds for every variant.
σ̂ is the pooled within-variant standard deviation of those runs; every interval uses it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from agent.core.config import Direction
from agent.rules.noise import mean, pooled_of, squared_deviations

Z95 = 1.96
DEFAULT_SEEDS = 3  # runs per variant (`overnight finalize --ablate --seeds`)
BEST, BASELINE, MINUS = "best", "baseline", "minus"  # the kinds of variant

HELPS = "helps"
MORE_TOGETHER = "helps more with the others than when kept"
LESS_TOGETHER = "helps less on top of the others than when kept"
NO_LONGER = "no longer helps on top of the others"
HURTS = "hurts on top of the others"
UNMEASURED = "not measured"
# With one kept change there are no others: the best minus it is the baseline.
ALONE = {MORE_TOGETHER: "helps more measured again than when kept",
         LESS_TOGETHER: "helps less measured again than when kept",
         NO_LONGER: "does not hold when measured again",
         HURTS: "hurts when measured again"}


@dataclass(frozen=True)
class KeptChange:
    """One kept change as the night saw it: its gain over the head it was kept on."""

    id: int
    description: str
    night_gain: float | None  # better = positive
    night_n: int = 1  # runs of the change
    base_n: int = 1  # runs of the head it was compared with


@dataclass(frozen=True)
class ChangeAttribution:
    id: int
    description: str
    gain: float | None  # metric(best minus it) vs metric(best), better = positive
    ci: float | None
    night_gain: float | None
    night_ci: float | None
    verdict: str
    note: str = ""

    @property
    def flagged(self) -> bool:
        """Anything but a plain "helps": worth a look before merging."""
        return self.verdict != HELPS


@dataclass(frozen=True)
class Attribution:
    sweep: str  # the ablation sweep
    seeds: int
    sigma: float | None
    df: int
    best: float | None  # the mean of the best's runs now
    baseline: float | None
    total: float | None  # baseline → best now, better = positive
    total_ci: float | None
    changes: list[ChangeAttribution] = field(default_factory=list)
    interaction: float | None = None  # Σ gains − total (0 when the gains add up)
    interaction_ci: float | None = None
    runs: int = 0  # runs the ablation spent
    notes: list[str] = field(default_factory=list)

    @property
    def additive(self) -> bool | None:
        """Do the leave-one-out gains add up to the whole chain's gain (within noise)?"""
        if self.interaction is None or self.interaction_ci is None:
            return None
        return abs(self.interaction) <= self.interaction_ci

    @property
    def sum_of_gains(self) -> float | None:
        if self.total is None or self.interaction is None:
            return None
        return self.total + self.interaction


def attribute(sweep: str, direction: Direction, kept: Sequence[KeptChange],
              variants: Mapping[tuple[str, int | None], Sequence[float]],
              night_sigma: float | None = None, seeds: int = 0,
              notes: Mapping[int, str] | None = None,
              samples: Sequence[Sequence[float]] | None = None) -> Attribution:
    """The attribution from each variant's metrics: `variants[(BEST, None)]`,
    `variants[(BASELINE, None)]` and `variants[(MINUS, kept id)]`. `night_sigma`: σ̂ of the
    night, for the intervals of the gains when kept (the ablation's σ̂ when None). `notes`:
    why a variant has no runs (it could not be built, it crashed). `samples`: the metrics of
    each variant run, once each (a variant can stand under two keys: with one kept change the
    best minus it is the baseline); σ̂, its df and the runs spent come from them (default: each
    key's metrics)."""
    sign = 1.0 if direction is Direction.MINIMIZE else -1.0
    groups = [list(v) for v in (variants.values() if samples is None else samples) if v]
    sigma, df = pooled_of([squared_deviations(groups)])
    best = list(variants.get((BEST, None), ()))
    base = list(variants.get((BASELINE, None), ()))
    total, total_ci = _gap(base, best, sigma, sign)
    changes = [_change(k, variants.get((MINUS, k.id), ()), best, sigma,
                       night_sigma if night_sigma is not None else sigma, sign,
                       (notes or {}).get(k.id, "")) for k in kept]
    if len(changes) == 1:
        changes = [replace(c, verdict=ALONE.get(c.verdict, c.verdict)) for c in changes]
    sizes = {k.id: len(variants.get((MINUS, k.id), ())) for k in kept}
    interaction, interaction_ci = _interaction(changes, sizes, len(base), len(best), total,
                                               sigma)
    spent = sum(len(g) for g in groups)
    return Attribution(sweep, seeds, sigma, df, mean(best), mean(base), total, total_ci,
                       changes, interaction, interaction_ci, spent)


def _gap(worse: Sequence[float], better: Sequence[float], sigma: float | None, sign: float
         ) -> tuple[float | None, float | None]:
    """sign·(mean(worse) − mean(better)) ± its 95 % half-width."""
    if not worse or not better:
        return None, None
    gap = sign * (sum(worse) / len(worse) - sum(better) / len(better))
    ci = None if sigma is None else Z95 * sigma * math.sqrt(1 / len(worse) + 1 / len(better))
    return gap, ci


def _change(k: KeptChange, minus: Sequence[float], best: Sequence[float], sigma: float | None,
            night_sigma: float | None, sign: float, note: str) -> ChangeAttribution:
    gain, ci = _gap(minus, best, sigma, sign)
    night_ci = (None if night_sigma is None or k.night_gain is None else
                Z95 * night_sigma * math.sqrt(1 / max(k.night_n, 1) + 1 / max(k.base_n, 1)))
    verdict = _verdict(gain, ci, k.night_gain, night_ci)
    if verdict is UNMEASURED and not note:
        note = "its variant has no runs"
    return ChangeAttribution(k.id, k.description, gain, ci, k.night_gain, night_ci, verdict,
                             note)


def _verdict(gain: float | None, ci: float | None, night: float | None,
             night_ci: float | None) -> str:
    """What a change's gain on top of the others says, read through both intervals."""
    if gain is None:
        return UNMEASURED
    half = ci or 0.0
    if gain + half < 0:
        return HURTS
    if gain - half <= 0:
        return NO_LONGER
    if night is None:
        return HELPS
    apart = math.hypot(half, night_ci or 0.0)
    if gain - night > apart:
        return MORE_TOGETHER
    if night - gain > apart:
        return LESS_TOGETHER
    return HELPS


def _interaction(changes: Sequence[ChangeAttribution],
                 sizes: Mapping[int, int], n_base: int, n_best: int, total: float | None,
                 sigma: float | None) -> tuple[float | None, float | None]:
    """Σ leave-one-out gains − the whole chain's gain, ± its 95 % half-width.

    Σ_i (m_i − b) − (a − b) = Σ m_i − a − (K − 1)·b for the means m_i (minus i), a (baseline)
    and b (best): its variance is σ²·(Σ 1/n_i + 1/n_a + (K − 1)²/n_b)."""
    gains = [c.gain for c in changes]
    if len(gains) < 2 or total is None or sigma is None or any(g is None for g in gains):
        return None, None
    k = len(gains)
    var = sigma ** 2 * (sum(1 / sizes[c.id] for c in changes) + 1 / n_base
                        + (k - 1) ** 2 / n_best)
    return sum(g for g in gains if g is not None) - total, Z95 * math.sqrt(var)


# --- which sweep is an ablation, and of what ---------------------------------------------------
ABLATION_PREFIX = "ablation:"  # an ablation sweep's proposer: "ablation:<sweep it ablates>"


def ablated_sweep(proposer: str) -> str | None:
    """The sweep an ablation sweep measures (from its proposer), or None for any other sweep."""
    return proposer[len(ABLATION_PREFIX):] if proposer.startswith(ABLATION_PREFIX) else None


VariantKey = tuple[str, int | None]


def variant_keys(meta: Mapping[str, object]) -> list[VariantKey]:
    """The variants one ablation experiment measures, from its meta["ablation"]["keys"]
    ([[kind, left-out id or null], ...]); [] for an experiment that is not one."""
    info = meta.get("ablation")
    if not isinstance(info, Mapping):
        return []
    out: list[VariantKey] = []
    for item in info.get("keys", ()) or ():
        if isinstance(item, Sequence) and len(item) == 2 and item[0] in (BEST, BASELINE, MINUS):
            out.append((str(item[0]), int(item[1]) if item[1] is not None else None))
    return out
