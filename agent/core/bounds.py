"""Constraints beside the metric: `[target.constraints]` bounds on summary-block keys
(docs/keep-rule.md#constraints-and-simplicity), read here and checked by the keep rule.

    [target.constraints]
    peak_memory_mb = "<= 70000"                               # hard: over it, discarded
    tokens_per_s = ">= 0.9 x incumbent"                       # hard, against the incumbent
    peak_vram_mb = "<= 1.0 x incumbent, soft 0.005 per 10 %"  # soft: a cost, paid in gain

A bound compares the mean of the change's runs (those that reported the key) with a number, or
with a factor times the incumbent runs' mean. A hard bound discards the change the first time
its mean is past it. A soft bound asks more gain for a change past it: `price` more (in the
metric's units) for each `per` share of the bound it is past, so `soft 0.005 per 10 %` asks a
change 30 % over for 0.015 more. Pure: the stdlib only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

EXAMPLES = ('"<= 70000", ">= 0.9 x incumbent" or "<= 1.0 x incumbent, soft 0.005 per 10 %"')
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_BOUND = re.compile(
    rf"^\s*(?P<op><=|>=)\s*(?P<value>{_NUMBER})\s*(?:(?:x|\*|×)\s*(?P<incumbent>incumbent))?"
    rf"\s*(?:,\s*soft\s+(?P<price>{_NUMBER})\s+per\s+(?P<per>{_NUMBER})\s*%)?\s*$")


def finite_number(value: object) -> float | None:
    """A summary value as a bound reads it: a finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


@dataclass(frozen=True)
class Bound:
    """One bound on one summary-block key."""

    key: str
    at_most: bool  # "<=": a larger value is the cost; ">=": a smaller one
    value: float  # the number, or the factor of the incumbent's mean
    relative: bool = False  # value × the incumbent runs' mean of the key
    price: float | None = None  # soft: more gain asked per `per` share past the bound
    per: float = 0.1  # a share (0.1: 10 %)

    @property
    def hard(self) -> bool:
        return self.price is None

    @property
    def text(self) -> str:
        """As written in overnight.toml: "<= 1.0 x incumbent, soft 0.005 per 10 %"."""
        out = f"{'<=' if self.at_most else '>='} {self.value:g}" + (
            " x incumbent" if self.relative else "")
        if self.price is not None:
            out += f", soft {self.price:g} per {self.per * 100:g} %"
        return out

    def limit(self, incumbent: float | None) -> float | None:
        """The bound's number: its value, or the factor times the incumbent's mean (None when
        the incumbent's runs did not report the key)."""
        if not self.relative:
            return self.value
        return None if incumbent is None else self.value * incumbent

    def past(self, value: float, limit: float) -> float:
        """How far `value` is past `limit`, as a share of |limit| (0 within it)."""
        over = value - limit if self.at_most else limit - value
        if over <= 0:
            return 0.0
        return over / abs(limit) if limit else math.inf

    def cost(self, value: float, limit: float) -> float:
        """A soft bound's extra gain asked of a change at `value` (0 for a hard bound)."""
        if self.price is None:
            return 0.0
        share = self.past(value, limit)
        return self.price * share / self.per if share else 0.0


def parse_bound(key: str, text: str) -> Bound:
    """One bound from its text; ValueError names what is wrong and shows the forms."""
    m = _BOUND.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{key}: {text!r} is not a bound: write {EXAMPLES}")
    value = float(m["value"])
    if m["incumbent"] and value <= 0:
        raise ValueError(f"{key}: the factor of the incumbent must be positive, got {value:g}")
    price = float(m["price"]) if m["price"] is not None else None
    per = float(m["per"]) / 100 if m["per"] is not None else 0.1
    if price is not None and (price <= 0 or per <= 0):
        raise ValueError(f"{key}: a soft bound's price and share must be positive, got "
                         f"{text!r}")
    return Bound(key, m["op"] == "<=", value, bool(m["incumbent"]), price, per)


def parse_bounds(table: Mapping[str, Any]) -> tuple[Bound, ...]:
    """`[target.constraints]`: each key a bound's text or a list of them."""
    out: list[Bound] = []
    for key, spec in table.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"{key!r} is not a summary-block key")
        texts = spec if isinstance(spec, list | tuple) else [spec]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"{key}: write a bound such as {EXAMPLES}, or a list of them; "
                             f"got {spec!r}")
        out.extend(parse_bound(key, t) for t in texts)
    return tuple(out)


def bounds_table(bounds: tuple[Bound, ...]) -> dict[str, str | list[str]]:
    """The table as overnight.toml writes it (parse_bounds's inverse)."""
    table: dict[str, list[str]] = {}
    for b in bounds:
        table.setdefault(b.key, []).append(b.text)
    return {k: v[0] if len(v) == 1 else v for k, v in table.items()}


@dataclass(frozen=True)
class BoundCheck:
    """A bound as a verdict checked it: the change's mean of the key (over `n` runs), the
    bound's number then, how far past it the change was, and the gain that asked of it."""

    bound: Bound
    value: float | None  # the change's mean (None: its runs did not report the key)
    n: int
    limit: float | None  # None: a relative bound whose incumbent runs did not report the key
    past: float = 0.0  # share of |limit| past it (0: within)
    cost: float = 0.0  # soft: more gain asked
    incumbent_n: int = 0  # the incumbent runs it was compared with that reported the key

    @property
    def broken(self) -> bool:
        """A hard bound the change is past, or one it did not report while the incumbent did
        (a change that stops printing a bounded key is not let past it)."""
        if not self.bound.hard:
            return False
        if self.value is None:
            return self.incumbent_n > 0
        return self.limit is not None and self.past > 0

    def text(self) -> str:
        """"peak_memory_mb 81234 (mean of 2 runs) is 16 % over its bound <= 70000", "tokens_per_s
        85 (mean of 1 run) is 6 % under its bound 90 (>= 0.9 x incumbent)"."""
        b = self.bound
        if self.value is None:
            return f"{b.key} was not reported by its runs, and it is bounded ({b.text})"
        runs = f"{self.n} run{'s' if self.n != 1 else ''}"
        bound = b.text if self.limit is None or not b.relative else \
            f"{number_text(self.limit)} ({b.text})"
        if self.past <= 0:
            return f"{b.key} {number_text(self.value)} (mean of {runs}) is within its bound {bound}"
        where = "over" if b.at_most else "under"
        return (f"{b.key} {number_text(self.value)} (mean of {runs}) is {round(self.past * 100)} % "
                f"{where} its bound {bound}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.bound.key, "bound": self.bound.text,
                               "value": self.value, "n": self.n, "limit": self.limit,
                               "hard": self.bound.hard}
        if self.past:
            out["past"] = self.past
        if self.cost:
            out["cost"] = self.cost
        if self.incumbent_n:
            out["incumbent_n"] = self.incumbent_n
        return out

    @classmethod
    def of(cls, data: object) -> BoundCheck | None:
        if not isinstance(data, Mapping):
            return None
        try:
            bound = parse_bound(str(data["key"]), str(data["bound"]))
        except (KeyError, ValueError):
            return None
        return cls(bound, finite_number(data.get("value")), _count(data.get("n")),
                   finite_number(data.get("limit")), finite_number(data.get("past")) or 0.0,
                   finite_number(data.get("cost")) or 0.0, _count(data.get("incumbent_n")))


def check(bound: Bound, change: list[float], incumbent: list[float]) -> BoundCheck:
    """A bound checked on the change's runs' values of its key against the incumbent runs'."""
    value = sum(change) / len(change) if change else None
    limit = bound.limit(sum(incumbent) / len(incumbent) if incumbent else None)
    if value is None or limit is None:
        return BoundCheck(bound, value, len(change), limit, incumbent_n=len(incumbent))
    return BoundCheck(bound, value, len(change), limit, bound.past(value, limit),
                      bound.cost(value, limit), len(incumbent))


def _count(value: object) -> int:
    n = finite_number(value)
    return int(n) if n is not None and n >= 0 else 0


def number_text(value: float) -> str:
    """A bounded value as every reason writes it: whole from 1000 up, else 4 digits."""
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"
