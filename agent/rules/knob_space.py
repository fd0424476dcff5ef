"""How one numeric or boolean constant moves: its scale, a step in that scale, its literal. Pure.

Every knob gets a coordinate `u` in which a step of `ln 2` is a sensible first move:
log scale for positive numbers (learning rates, widths, batch sizes, RoPE bases), log-odds for
fractions in (0, 1) (betas, warm-up fractions: they approach their bounds and never cross them),
rounded log scale for integers (200 moves to 400 or 100, never to 201). A zero can only be
switched on; a boolean only flipped.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

FIRST_STEP = math.log(2.0)  # ×2 / ÷2 (odds ×2 / ÷2 for fractions)
MIN_STEP = FIRST_STEP / 8  # finer than ~9 % is below what a noisy short run can tell apart
FRACTION_EDGE = 1e-6
SMALL = 0.05  # below this a number in (0, 1) is a small quantity (eps, lr), not a fraction
_LR_NAME = re.compile(r"(^|_)(LR|LEARNING_RATE)(_|$)")
_FRACTION_NAME = re.compile(r"FRAC|BETA|MOMENTUM|DROPOUT|PROB|RATIO|DECAY|TOP_P|EMA")


@dataclass(frozen=True)
class KnobValue:
    """One UPPER_CASE constant at the sweep head."""

    name: str
    raw: str  # the literal as written
    value: float | int | bool

    @property
    def scale(self) -> str:
        return scale_of(self.name, self.value)


def parse_literal(raw: str) -> float | int | bool:
    """A knob's literal as written: Python's True/False or YAML/TOML/JSON's true/false, an int
    (underscores allowed) or a float. ValueError for anything else."""
    if raw in ("True", "False", "true", "false"):
        return raw in ("True", "true")
    if re.fullmatch(r"[-+]?\d[\d_]*", raw):
        return int(raw.replace("_", ""))
    return float(raw)


def scale_of(name: str, value: float | int | bool) -> str:
    """bool | int | log | fraction | zero | linear. Fractions are numbers in (0, 1) named like
    one (BETA, *_FRAC, DROPOUT...) or not small; learning rates are never fractions."""
    if isinstance(value, bool):
        return "bool"
    if value == 0:
        return "zero"
    if value < 0:
        return "linear"
    if isinstance(value, int):
        return "int"
    if 0 < value < 1 and not _LR_NAME.search(name) and (
            value >= SMALL or _FRACTION_NAME.search(name)):
        return "fraction"
    return "log"


def to_coordinate(scale: str, value: float) -> float:
    if scale in ("log", "int"):
        return math.log(value)
    if scale == "fraction":
        v = min(max(value, FRACTION_EDGE), 1 - FRACTION_EDGE)
        return math.log(v / (1 - v))
    return float(value)


def from_coordinate(scale: str, u: float) -> float:
    if scale in ("log", "int"):
        return math.exp(u)
    if scale == "fraction":
        return 1.0 / (1.0 + math.exp(-u))
    return u


def _integer_step(value: float) -> int:
    """Integers are rounded to about 1/16 of their size, in powers of two: 200 ×√2 → 280,
    128 ×√2 → 184, 100 stays 100, 6 and 3 move by 1."""
    return int(2 ** max(0, int(math.floor(math.log2(max(value, 1) / 16)))))


def fmt_float(new: float, raw: str) -> str:
    """A float literal in the style of `raw` (scientific stays scientific), 4 significant digits."""
    if "e" in raw.lower() or (new != 0 and abs(new) < 1e-3):
        mant, exp = f"{new:.2e}".split("e")
        mant = mant.rstrip("0").rstrip(".")
        return f"{mant}e{int(exp)}"
    text = f"{new:.4g}" if abs(new) < 1e4 else f"{round(new, 1):.1f}"
    return text if any(c in text for c in ".e") else text + ".0"


def _fraction_literal(new: float, raw: str) -> str:
    """Enough digits that 0.99995 is not written as 1.0."""
    for digits in range(4, 9):
        text = f"{new:.{digits}g}"
        if 0 < float(text) < 1:
            return text if "." in text or "e" in text else text + ".0"
    return fmt_float(new, raw)


def _int_step(value: int, factor: float) -> int | None:
    target = value * factor
    grain = _integer_step(min(value, target))
    new = int(target / grain + 0.5) * grain
    if new == value:
        new = value + (grain if factor > 1 else -grain)
    return new if new >= 1 else None


def moved(knob: KnobValue, direction: int, step: float) -> str | None:
    """The literal `step` (in u) away from the knob in `direction` (+1 up, -1 down), or None
    when that move does not exist (a zero cannot go down, a bool only flips one way)."""
    scale, v = knob.scale, knob.value
    if scale == "bool":
        return ("False" if v else "True") if direction == (-1 if v else 1) else None
    if scale == "zero":
        if direction < 0:
            return None
        return "1" if isinstance(v, int) else fmt_float(0.1, knob.raw)
    if scale == "int":
        new_int = _int_step(int(v), math.exp(direction * step))
        return None if new_int is None else str(new_int)
    if scale == "linear":
        if isinstance(v, int):
            return str(int(v) + direction * max(1, int(round(abs(v) * step))))
        return fmt_float(float(v) + direction * abs(float(v)) * step, knob.raw)
    new = from_coordinate(scale, to_coordinate(scale, float(v)) + direction * step)
    if scale == "fraction":
        return _fraction_literal(new, knob.raw)
    return fmt_float(new, knob.raw)


def coordinate(name: str, raw: str) -> float | None:
    """u of a literal on the knob's scale as seen from `raw`'s value (None for bool/zero)."""
    value = parse_literal(raw)
    scale = scale_of(name, value)
    if scale in ("bool", "zero"):
        return None
    return to_coordinate(scale, float(value))


def direction_of(name: str, old: str, new: str) -> int:
    """+1 when the change moves the constant up (or switches it on), -1 down, 0 unknown."""
    try:
        a, b = parse_literal(old), parse_literal(new)
    except ValueError:
        return 0
    if isinstance(a, bool) or isinstance(b, bool):
        return 0 if a == b else (1 if b else -1)
    return 0 if a == b else (1 if b > a else -1)


def step_between(name: str, old: str, new: str) -> float | None:
    """The size of a move in u (None where the scale has no distance)."""
    try:
        a, b = parse_literal(old), parse_literal(new)
    except ValueError:
        return None
    if isinstance(a, bool) or isinstance(b, bool) or a == 0 or b == 0 or (a < 0) != (b < 0):
        return None
    scale = scale_of(name, a)
    if scale == "fraction" and not 0 < b < 1:
        return None
    return abs(to_coordinate(scale, float(b)) - to_coordinate(scale, float(a)))
