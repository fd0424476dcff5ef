"""A run's throughput from wherever the script shows it, first found wins: the summary's
``total_tokens_M`` (tokens/s) or ``num_steps`` (steps/s) over its ``training_seconds``; else the
steps per second between the first and last progress lines that print an elapsed time (start-up
left out), over at least MIN_ELAPSED_S of it (elapsed times printed to the hundredth measure
their own rounding); else the same by the service's clock for lines without one, over at least
MIN_CLOCK_S (a burst read in one poll says nothing); else nothing (then the machine's load
cannot be checked for this target). Pure: the stdlib only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

MIN_CLOCK_S = 1.0  # lines that arrive within this (a burst, one poll) do not time the run
MIN_ELAPSED_S = 0.2  # printed elapsed times closer than this: a 0.01 s rounding is > 5 %
SUMMARY_KEYS = (("total_tokens_M", 1e6, "tokens/s"), ("num_steps", 1.0, "steps/s"))
@dataclass(frozen=True)
class Speed:
    value: float | None
    unit: str | None = None
    source: str | None = None  # None: unknown


@dataclass(frozen=True)
class Point:
    step: int
    elapsed_s: float | None
    at: float  # the service's clock when the line arrived (monotonic seconds)


@dataclass
class ProgressMeter:
    """The first and last progress points of one run (and the first and last that print an
    elapsed time)."""

    first: Point | None = None
    last: Point | None = None
    first_timed: Point | None = None
    last_timed: Point | None = None
    lines: int = 0

    def add(self, step: int, elapsed_s: float | None, now: float) -> None:
        point = Point(step, elapsed_s, now)
        self.first, self.last = self.first or point, point
        if elapsed_s is not None and math.isfinite(elapsed_s):
            self.first_timed, self.last_timed = self.first_timed or point, point
        self.lines += 1


def _finite(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def from_summary(summary: Mapping[str, float | str]) -> Speed:
    seconds = _finite(summary.get("training_seconds"))
    if seconds is None or seconds <= 0:
        return Speed(None)
    for key, scale, unit in SUMMARY_KEYS:
        value = _finite(summary.get(key))
        if value is not None and value > 0:
            return Speed(value * scale / seconds, unit, f"summary: {key}")
    return Speed(None)


def from_progress(meter: ProgressMeter | None) -> Speed:
    if meter is None or meter.last is None or meter.first is None:
        return Speed(None)
    a, b = meter.first_timed, meter.last_timed
    if a is not None and b is not None and a.elapsed_s is not None and b.elapsed_s is not None:
        span, steps = b.elapsed_s - a.elapsed_s, b.step - a.step
        if span >= MIN_ELAPSED_S and steps > 0:
            return Speed(steps / span, "steps/s", "progress: elapsed")
        if b.elapsed_s >= MIN_ELAPSED_S and b.step > 0:
            return Speed(b.step / b.elapsed_s, "steps/s", "progress: elapsed")
    span, steps = meter.last.at - meter.first.at, meter.last.step - meter.first.step
    if span >= MIN_CLOCK_S and steps > 0:
        return Speed(steps / span, "steps/s", "progress: clock")
    return Speed(None)


def speed(summary: Mapping[str, float | str], meter: ProgressMeter | None = None) -> Speed:
    """The run's throughput from the first source that has it (see the module docstring)."""
    found = from_summary(summary)
    return found if found.value is not None else from_progress(meter)
