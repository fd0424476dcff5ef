"""Does a night's gain hold at a larger setting? The baseline and the best re-run under a larger
budget, another device or a larger size knob (`--confirm-at`), k seeds each, read as a verdict:
holds, shrinks, flips or unclear.

Pure: stdlib, config's Direction and agent.rules.noise. The setting is parsed here
(`parse_at`); agent.ops.confirm builds and queues the runs, agent.engine.ablation's loop runs
them. Gains are compared relative to each setting's own baseline (a longer budget moves the
metric's whole scale: an absolute gain of 0.01 at 60 s and at 1800 s are not the same thing).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from agent.core.budget import ComputeBudget, parse_budget
from agent.core.config import Direction
from agent.core.errors import ConfigError
from agent.rules.noise import mean, pooled_of, squared_deviations

Z95 = 1.96
DEFAULT_SEEDS = 3  # runs of the baseline and of the best at the larger setting
CONFIRM_PREFIX = "confirm:"  # a confirmation sweep's proposer: "confirm:<sweep it confirms>"
BUDGET, DEVICE = "budget", "device"  # the setting's keys besides a size knob's NAME
HOLDS, SHRINKS, FLIPS, UNCLEAR = "holds", "shrinks", "flips", "unclear"
_KNOB = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEVICE = re.compile(r"^[A-Za-z0-9_.:,-]{1,100}$")


@dataclass(frozen=True)
class ConfirmAt:
    """The larger setting: `budget` (seconds), `device` (OVERNIGHT_DEVICE) or a size knob's
    NAME with its numeric VALUE (the same one-line change to the baseline and to the best)."""

    key: str
    value: str

    @property
    def budget(self) -> float | ComputeBudget | None:
        """Seconds, or a compute budget ("2000 steps"), of a `budget=` setting."""
        return parse_budget(self.value) if self.key == BUDGET else None

    @property
    def device(self) -> str | None:
        return self.value if self.key == DEVICE else None

    @property
    def knob(self) -> str | None:
        return None if self.key in (BUDGET, DEVICE) else self.key

    def text(self) -> str:
        return f"{self.key}={self.value}"


def parse_at(text: str) -> ConfirmAt:
    """`budget=1800` (or a compute budget, `budget=2000 steps`), `device=cuda:1` or `NAME=VALUE`
    (a numeric value): ConfigError naming the problem otherwise."""
    key, sep, value = (text or "").partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key or not value:
        raise ConfigError(f"--confirm-at: expected KEY=VALUE (budget=1800 or budget=2000 steps, "
                          f"device=cuda, or a size knob such as DEPTH=8), got {text!r}")
    if key == BUDGET:
        seconds = _number(value)
        if seconds is not None and (not math.isfinite(seconds) or seconds <= 0):
            raise ConfigError(f"--confirm-at: budget must be a positive number of seconds, "
                              f"got {value!r}")
        try:
            given = seconds if seconds is not None else parse_budget(value)
        except ValueError as exc:
            raise ConfigError(f"--confirm-at: budget {exc}") from None
        return ConfirmAt(BUDGET, f"{given:g}" if isinstance(given, float) else str(given))
    if key == DEVICE:
        if not _DEVICE.match(value):
            raise ConfigError(f"--confirm-at: device must be a device name such as cuda:1, "
                              f"got {value!r}")
        return ConfirmAt(DEVICE, value)
    if not _KNOB.match(key):
        raise ConfigError(f"--confirm-at: unknown key {key!r}: use budget, device or a size "
                          "knob's NAME (a variable of the training script)")
    if _number(value) is None:
        raise ConfigError(f"--confirm-at: {key} must be given a number, got {value!r}")
    return ConfirmAt(key, value)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Confirmation:
    """What the re-runs at the larger setting say about the night's gain."""

    sweep: str  # the confirmation sweep
    at: str  # the setting, "budget=1800"
    seeds: int
    baseline: float | None  # mean of the baseline's runs at the setting
    best: float | None
    baseline_n: int
    best_n: int
    gain: float | None  # baseline → best at the setting, better = positive
    gain_ci: float | None
    relative: float | None  # gain / |baseline| at the setting
    relative_ci: float | None
    night_relative: float | None  # the night's gain / |its baseline|
    night_relative_ci: float | None
    sigma: float | None
    verdict: str
    reason: str
    runs: int = 0  # runs the confirmation spent (failed ones included)
    night_baseline: float | None = None  # the night's baseline mean, its gain and half-width
    night_gain: float | None = None
    night_gain_ci: float | None = None


def confirm(sweep: str, at: str, direction: Direction, baseline: Sequence[float],
            best: Sequence[float], night: tuple[float | None, float | None, float | None],
            seeds: int = 0, runs: int | None = None) -> Confirmation:
    """The verdict from the metrics of the baseline's and the best's runs at the setting.
    `night`: the night's (gain, its 95 % half-width, its baseline's mean)."""
    sign = 1.0 if direction is Direction.MINIMIZE else -1.0
    sigma, _ = pooled_of([squared_deviations([list(baseline), list(best)])])
    a, b = mean(baseline), mean(best)
    gain = gain_ci = rel = rel_ci = None
    if a is not None and b is not None:
        gain = sign * (a - b)
        if sigma is not None:
            gain_ci = Z95 * sigma * math.sqrt(1 / len(baseline) + 1 / len(best))
        if a:
            rel = gain / abs(a)
            rel_ci = None if gain_ci is None else gain_ci / abs(a)
    n_gain, n_ci, n_base = night
    n_rel = n_gain / abs(n_base) if n_gain is not None and n_base else None
    n_rel_ci = n_ci / abs(n_base) if n_ci is not None and n_base else None
    verdict, reason = _verdict(rel, rel_ci, n_rel, n_rel_ci, len(baseline), len(best))
    spent = len(baseline) + len(best) if runs is None else runs
    return Confirmation(sweep, at, seeds, a, b, len(baseline), len(best), gain, gain_ci, rel,
                        rel_ci, n_rel, n_rel_ci, sigma, verdict, reason, spent, n_base,
                        n_gain, n_ci)


def _verdict(rel: float | None, ci: float | None, night: float | None,
             night_ci: float | None, n_a: int, n_b: int) -> tuple[str, str]:
    """holds: still clearly better, not clearly less than at night; shrinks: clearly less
    than at night (better still, or not told from nothing); flips: clearly worse; unclear: the
    runs cannot tell (too few, or the interval spans zero and the night's gain alike)."""
    if rel is None:
        return UNCLEAR, f"not measured ({n_a} baseline and {n_b} best run(s) gave a metric)"
    if ci is None:
        return UNCLEAR, "no interval: the noise could not be measured (one run each?)"
    if rel + ci < 0:
        return FLIPS, f"the best is worse at this setting ({rel:+.2%} ± {ci:.2%})"
    smaller = night is not None and night - rel > math.hypot(ci, night_ci or 0.0)
    if smaller:
        left = "still better" if rel - ci > 0 else "not told from zero"
        return SHRINKS, (f"{rel:+.2%} ± {ci:.2%}, clearly less than the night's "
                         f"{night:+.2%} ({left})")
    if rel - ci > 0:
        return HOLDS, f"{rel:+.2%} ± {ci:.2%} (the night's: {_pct(night)})"
    return UNCLEAR, f"{rel:+.2%} ± {ci:.2%} spans zero (the night's: {_pct(night)})"


def _pct(v: float | None) -> str:
    return "unknown" if v is None else f"{v:+.2%}"


def confirmed_sweep(proposer: str) -> str | None:
    """The sweep a confirmation sweep re-runs (from its proposer), or None for any other."""
    return proposer[len(CONFIRM_PREFIX):] if proposer.startswith(CONFIRM_PREFIX) else None
