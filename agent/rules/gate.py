"""May a sweep start another experiment now? Daily windows, deadlines and limits as pure rules.

Pure: stdlib and the domain only; the clock is an argument, so tests never sleep.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import datetime, time, tzinfo

from agent.core.domain import SweepStatus

_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")


class GateKind(str, enum.Enum):
    START = "start"  # a slot may start (or propose) the sweep's next experiment
    WAIT = "wait"  # not now (paused, outside the window, baseline still running)
    FINISH = "finish"  # a limit is reached: the sweep is done (the in-flight run still finishes)


@dataclass(frozen=True)
class Gate:
    kind: GateKind
    reason: str = ""
    # FINISH because max_experiments is reached: no new proposal, but what the sweep already
    # started (a change re-queued on a new head, a repair) may still run
    at_max: bool = False


@dataclass(frozen=True)
class SweepFacts:
    """What `gate` needs to know about a sweep, read from the store."""

    status: SweepStatus
    max_experiments: int | None = None
    deadline: datetime | None = None
    window: dict[str, str] | None = None
    used: int = 0  # non-baseline experiments run, running or rejected
    running: int = 0  # experiments of this sweep running now
    baseline_kept: bool = False


def parse_hhmm(value: str) -> time:
    """'22:00' → time(22, 0). Raises ValueError for anything else."""
    m = _HHMM.match(value or "")
    if not m:
        raise ValueError(f"{value!r} is not a time of day HH:MM (00:00-23:59)")
    return time(int(m.group(1)), int(m.group(2)))


def in_window(window: dict[str, str] | None, now: datetime, tz: tzinfo | None = None) -> bool:
    """Is `now` inside the daily window {start, stop} (server local time unless `tz`)?

    A window may wrap midnight (22:00 → 07:00); start == stop means all day.
    """
    if not window:
        return True
    start, stop = parse_hhmm(window["start"]), parse_hhmm(window["stop"])
    t = now.astimezone(tz).time().replace(tzinfo=None)
    if start == stop:
        return True
    if start < stop:
        return start <= t < stop
    return t >= start or t < stop


def gate(facts: SweepFacts, now: datetime, tz: tzinfo | None = None) -> Gate:
    """May the sweep start another experiment at `now`? Pure."""
    if facts.status is not SweepStatus.RUNNING:
        return Gate(GateKind.WAIT, f"sweep is {facts.status.value}")
    if facts.deadline is not None and now >= facts.deadline:
        return Gate(GateKind.FINISH, "reached the deadline")
    if (facts.max_experiments is not None and facts.used >= facts.max_experiments
            and facts.baseline_kept):  # the baseline never counts: it runs even at 0
        return Gate(GateKind.FINISH, f"reached max_experiments={facts.max_experiments}",
                    at_max=True)
    if not in_window(facts.window, now, tz):
        assert facts.window is not None
        return Gate(GateKind.WAIT, f"outside the window {facts.window['start']}-"
                    f"{facts.window['stop']}")
    if not facts.baseline_kept and facts.running:
        return Gate(GateKind.WAIT, "the baseline runs alone")
    return Gate(GateKind.START)
