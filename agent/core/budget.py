"""A run's training budget: seconds of training (`budget_s`) or an amount of compute
(`budget = "600 steps"`, `"2M tokens"`), as overnight.toml and `--budget` spell it.

Pure: the stdlib only. On a time budget a faster stretch of the machine trains more, so the
machine's speed is part of a run's metric; on a compute budget every run trains the same amount
whatever the load, so it is not (docs/keep-rule.md#the-model).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Unit = Literal["steps", "tokens"]
# the variable that hands each kind of budget to the script
ENV_OF: dict[str, str] = {"s": "OVERNIGHT_BUDGET_S", "steps": "OVERNIGHT_BUDGET_STEPS",
                          "tokens": "OVERNIGHT_BUDGET_TOKENS"}
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}
_TEXT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)\s*(steps?|tokens?|s|seconds?)?\s*$", re.I)
EXAMPLES = '"600 steps" or "2M tokens"'


@dataclass(frozen=True)
class ComputeBudget:
    """Train exactly `amount` optimizer steps or tokens, however long that takes."""

    amount: int
    unit: Unit

    @property
    def env_name(self) -> str:
        """OVERNIGHT_BUDGET_STEPS or OVERNIGHT_BUDGET_TOKENS."""
        return ENV_OF[self.unit]

    @property
    def env(self) -> dict[str, str]:
        """What the script is handed."""
        return {self.env_name: str(self.amount)}

    def __str__(self) -> str:
        for suffix, scale in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
            if self.amount % scale == 0:
                return f"{self.amount // scale}{suffix} {self.unit}"
        return f"{self.amount} {self.unit}"


def parse_budget(text: str | float | int) -> float | ComputeBudget:
    """`300`, `"300 s"` → 300.0 training seconds; `"600 steps"`, `"2M tokens"`, `"1.5k steps"`
    → a ComputeBudget. Raises ValueError saying what is accepted."""
    if isinstance(text, bool):
        raise ValueError(f"must be {EXAMPLES}, got {text!r}")
    if isinstance(text, int | float):
        return _seconds(float(text), text)
    m = _TEXT.match(text)
    if m is None:
        raise ValueError(f"must be {EXAMPLES} (or seconds: 300), got {text!r}")
    number, scale, unit = float(m.group(1)), _SCALE[m.group(2).lower()], (m.group(3) or "s")
    unit = unit.lower()
    if not unit.startswith(("step", "token")):
        if scale != 1:
            raise ValueError(f"seconds take no k/M/G suffix, got {text!r}")
        return _seconds(number, text)
    amount = number * scale
    if amount != int(amount) or amount < 1:
        raise ValueError(f"must be a whole number of {unit.rstrip('s')}s ≥ 1, got {text!r}")
    return ComputeBudget(int(amount), "steps" if unit.startswith("step") else "tokens")


def _seconds(value: float, text: object) -> float:
    if not value > 0:
        raise ValueError(f"must be a positive number of seconds, got {text!r}")
    return value


def budget_text(budget_s: float, compute: ComputeBudget | None) -> str:
    """The budget as a person reads it: "6 s" or "600 steps"."""
    return f"{budget_s:g} s" if compute is None else str(compute)
