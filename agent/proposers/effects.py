"""Per-knob effect estimates with their uncertainty: a small Bayesian regression. Pure.

Around the knob's current coordinate u0 (agent.rules.knob_space), the metric's change is
modelled as a local quadratic, loss(u) - loss(u0) = a·x² + b·x with x = u - u0. A one-knob run
from x_old to x_new observes loss_new - loss_best = a·(x_new² - x_old²) + b·(x_new - x_old) plus
noise, so (a, b) has a Gaussian posterior (prior N(0, τ²) scaled to the sweep's gain scale; the
observations weighted down as the head moves on; a run's noise taken as NOISE_SHARE of the gain
scale, which holds the moves' real effects as well as the run-to-run noise). Booleans and
zero-switches have one coefficient: the effect of switching on. The posterior gives a predicted
gain for any candidate value and a Thompson sample of it.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field

from agent.analysis.trials import Trial
from agent.rules.knob_space import FIRST_STEP, KnobValue, parse_literal, to_coordinate

PRIOR_SD_STEPS = 2.0  # a ×2 move changes the metric by about this many gain scales a priori
PRIOR_CURVATURE = 1.0  # ...and, slope aside, costs this many (the local optimum is near)
# A run's noise, as a share of the gain scale (1.4826 × MAD of every gain: the noise and the
# moves' real effects together, so more than the noise). At 1, a run left its own move's effect
# uncertain by a whole gain scale, so well-measured knobs were re-explored as if barely known
# (benchmarks/search.py, seeds 0-79 paired: closed share at 30 proposals +0.004 bowl, +0.001
# interact, +0.004 crash, +0.009 coupled; regret at 50 unchanged within its error).
NOISE_SHARE = 0.5


@dataclass
class Effect:
    """Posterior over (a, b) for a continuous knob, or (c, -) for a switch."""

    scale: float  # the sweep's gain scale (noise + typical effect)
    unit: float  # the knob's first step in u (ln 2)
    prior: float = 1.0  # multiplies the prior spread (some knobs matter more often)
    precision: list[list[float]] = field(default_factory=list)
    vector: list[float] = field(default_factory=lambda: [0.0, 0.0])
    n: float = 0.0  # total observation weight

    def __post_init__(self) -> None:
        sd_b = self.prior * PRIOR_SD_STEPS * self.scale / self.unit
        sd_a = self.prior * PRIOR_SD_STEPS * self.scale / self.unit ** 2
        self.precision = [[1 / sd_a ** 2, 0.0], [0.0, 1 / sd_b ** 2]]
        # A bowl is expected locally: a first step costs one gain scale before its slope.
        self.vector = [PRIOR_CURVATURE * self.scale / self.unit ** 2 / sd_a ** 2, 0.0]

    def observe(self, features: tuple[float, float], loss_delta: float, weight: float) -> None:
        """One run: features (x_new² - x_old², x_new - x_old), its loss change, its weight."""
        s2 = (NOISE_SHARE * self.scale) ** 2
        f0, f1 = features
        p = self.precision
        p[0][0] += weight * f0 * f0 / s2
        p[0][1] += weight * f0 * f1 / s2
        p[1][0] += weight * f0 * f1 / s2
        p[1][1] += weight * f1 * f1 / s2
        self.vector[0] += weight * f0 * loss_delta / s2
        self.vector[1] += weight * f1 * loss_delta / s2
        self.n += weight

    def _covariance(self) -> list[list[float]]:
        (p00, p01), (p10, p11) = self.precision
        det = p00 * p11 - p01 * p10
        return [[p11 / det, -p01 / det], [-p10 / det, p00 / det]]

    def mean(self) -> tuple[float, float]:
        c = self._covariance()
        v = self.vector
        return c[0][0] * v[0] + c[0][1] * v[1], c[1][0] * v[0] + c[1][1] * v[1]

    def sample(self, rng: random.Random) -> tuple[float, float]:
        """(a, b) drawn from the posterior (Cholesky of the 2×2 covariance)."""
        (c00, c01), (_, c11) = self._covariance()
        l00 = math.sqrt(max(c00, 0.0))
        l10 = c01 / l00 if l00 else 0.0
        l11 = math.sqrt(max(c11 - l10 * l10, 0.0))
        z0, z1 = rng.gauss(0.0, 1.0), rng.gauss(0.0, 1.0)
        m = self.mean()
        # Never a hill: a concave draw would send every move to the largest step.
        return max(m[0] + l00 * z0, 0.0), m[1] + l10 * z0 + l11 * z1

    def gain(self, x: float, coef: tuple[float, float] | None = None) -> float:
        """Predicted improvement (> 0 better) of moving to x from the current value."""
        a, b = coef or self.mean()
        return -(a * x * x + b * x)

    def spread(self, x: float) -> float:
        """Posterior standard deviation of the predicted gain at x."""
        c = self._covariance()
        f = (x * x, x)
        var = f[0] * f[0] * c[0][0] + 2 * f[0] * f[1] * c[0][1] + f[1] * f[1] * c[1][1]
        return math.sqrt(max(var, 0.0))

    def best_x(self, limit: float) -> float | None:
        """Where the mean model puts the knob's optimum, within ±limit (None if no minimum)."""
        a, b = self.mean()
        if a <= 0:
            return None
        return max(-limit, min(limit, -b / (2 * a)))


@dataclass
class Switch:
    """Posterior of the effect c of switching a boolean on (loss change = c · Δ)."""

    scale: float
    prior: float = 1.0
    precision: float = 0.0
    vector: float = 0.0
    n: float = 0.0

    def __post_init__(self) -> None:
        self.precision = 1 / (self.prior * PRIOR_SD_STEPS * self.scale) ** 2

    def observe(self, delta_on: float, loss_delta: float, weight: float) -> None:
        s2 = (NOISE_SHARE * self.scale) ** 2
        self.precision += weight * delta_on * delta_on / s2
        self.vector += weight * delta_on * loss_delta / s2
        self.n += weight

    def mean(self) -> float:
        return self.vector / self.precision

    def spread(self) -> float:
        return 1 / math.sqrt(self.precision)

    def sample(self, rng: random.Random) -> float:
        return self.mean() + self.spread() * rng.gauss(0.0, 1.0)


NAME_PRIORS: tuple[tuple[re.Pattern[str], float], ...] = (
    (re.compile(r"(^|_)(LR|LEARNING_RATE)(_|$)"), 2.0),
    (re.compile(r"BATCH|WARMUP|WARMDOWN|D_MODEL|WIDTH|DEPTH|LAYERS|WEIGHT_DECAY"), 1.3),
    (re.compile(r"ROPE|EPS|SEED|SOFTCAP|CLIP"), 0.6),
)
GENERATION_DECAY = 0.8  # an observation from k keeps ago counts 0.8^k


def prior_of(name: str) -> float:
    """How much a knob is believed to matter before any run (mild domain knowledge)."""
    for pattern, value in NAME_PRIORS:
        if pattern.search(name):
            return value
    return 1.0


def coordinate_of(scale: str, raw: str) -> float | None:
    """The coordinate of a literal on a given scale, None where it has none."""
    try:
        value = parse_literal(raw)
    except ValueError:
        return None
    if isinstance(value, bool) or scale in ("bool", "zero"):
        return None
    if scale in ("log", "int") and value <= 0 or scale == "fraction" and not 0 < value < 1:
        return None
    return to_coordinate(scale, float(value))


def switched_on(raw: str) -> float:
    """1 for True or a non-zero number, 0 for False or zero."""
    try:
        return 1.0 if parse_literal(raw) else 0.0
    except ValueError:
        return 0.0


def fit(knob: KnobValue, items: list[Trial], scale: float, generation: int) -> Effect | Switch:
    """The posterior for one knob from every one-constant run that changed it."""
    model: Effect | Switch
    if knob.scale in ("bool", "zero"):
        model = Switch(scale, prior_of(knob.name))
    else:
        model = Effect(scale, FIRST_STEP, prior_of(knob.name))
    u0 = coordinate_of(knob.scale, knob.raw)
    for t in items:
        if t.gain is None or not t.pure or len(t.changes) != 1 or t.changes[0].name != knob.name:
            continue
        c, weight = t.changes[0], GENERATION_DECAY ** (generation - t.generation)
        if isinstance(model, Switch):
            model.observe(switched_on(c.new) - switched_on(c.old), -t.gain, weight)
            continue
        old, new = coordinate_of(knob.scale, c.old), coordinate_of(knob.scale, c.new)
        if old is None or new is None or u0 is None:
            continue
        x_old, x_new = old - u0, new - u0
        model.observe((x_new ** 2 - x_old ** 2, x_new - x_old), -t.gain, weight)
    return model
