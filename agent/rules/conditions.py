"""The machine's conditions as the incumbent's runs show them: its runs grouped by speed per
device, the usual one (the most runs), each condition's speed and width, and the notes that say
where a run stood.

Pure: the stdlib only. A run stays in its device's latest condition while its throughput agrees
with that condition's median within the tolerance; a run back at an earlier condition's speed
(within JOIN of the tolerance) joins it, else it starts one. How far a change's run may be off a
condition and still count as run in it is that condition's width: SPEED_Z times the spread of
the incumbent's own speeds there, within WIDTH_FLOOR and the tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

Key = tuple[str | None, int]  # (device, the incumbent's condition on it)
JOIN = 0.5  # an incumbent run joins a condition within this share of the tolerance
SPEED_Z = 4.0  # a condition's width: this many times the spread of its incumbent runs' speeds
WIDTH_FLOOR = 0.03  # ... and never narrower than this share


@dataclass(frozen=True)
class Sample:
    """One finished run with a finite metric, as the decision sees it."""

    metric: float
    throughput: float | None = None
    run_id: int = 0  # start order within the sweep (ids grow); 0: order of the tuple only
    seed: int | None = None
    device: str | None = None
    pair_of: int | None = None  # an incumbent run: the change's run it was started beside
    source: str | None = None  # where the throughput came from (agent.throughput)


def agrees(value: float | None, reference: float | None, tolerance: float) -> bool:
    """Same speed within `tolerance` (a share of the reference); unknown speeds agree."""
    if value is None or reference is None or reference <= 0:
        return True
    return abs(value - reference) / reference <= tolerance


def conditions(best: Sequence[Sample], tolerance: float) -> list[Key]:
    """Each incumbent run's condition: runs in id order per device stay in the device's
    latest condition while their throughput agrees with its median within `tolerance`, else
    join the earlier condition whose median is nearest within JOIN of the tolerance (quiet
    spells are one condition), else start one; an unknown speed stays in the latest."""
    keys: list[Key] = []
    speeds: dict[Key, list[float]] = {}
    latest: dict[str | None, Key] = {}
    for b in best:
        key = latest.get(b.device)
        level = median(speeds[key]) if key is not None and speeds[key] else None
        if key is None or not agrees(b.throughput, level, tolerance):
            key = _nearest(b, speeds, tolerance)
            if key is None:
                key = (b.device, sum(1 for k in speeds if k[0] == b.device))
        speeds.setdefault(key, [])
        if b.throughput is not None:
            speeds[key].append(b.throughput)
        latest[b.device] = key
        keys.append(key)
    return keys


def _nearest(b: Sample, speeds: dict[Key, list[float]], tolerance: float) -> Key | None:
    if b.throughput is None:
        return None
    found, gap = None, math.inf
    for key, values in speeds.items():
        if key[0] != b.device or not values:
            continue
        level = median(values)
        off = abs(math.log(b.throughput / level)) if level > 0 else math.inf
        if agrees(b.throughput, level, tolerance * JOIN) and off < gap:
            found, gap = key, off
    return found


def usual_keys(keys: Sequence[Key]) -> dict[str | None, Key]:
    """Per device, the incumbent's usual condition: the one with the most runs (earliest on a
    tie)."""
    out: dict[str | None, Key] = {}
    for key in keys:
        best = out.get(key[0])
        if best is None or keys.count(key) > keys.count(best):
            out[key[0]] = key
    return out


def usual_runs(best: Sequence[Sample], tolerance: float) -> list[float]:
    """The metrics of the incumbent's runs in its usual condition (the most runs overall)."""
    if not best:
        return []
    keys = conditions(best, tolerance)
    top = max(dict.fromkeys(keys), key=keys.count)  # first of the most common
    return [b.metric for b, k in zip(best, keys, strict=True) if k == top]


def levels(best: Sequence[Sample], keys: Sequence[Key]) -> dict[Key, float | None]:
    out: dict[Key, float | None] = {}
    for key in dict.fromkeys(keys):
        values = [b.throughput for b, k in zip(best, keys, strict=True)
                  if k == key and b.throughput is not None]
        out[key] = median(values) if values else None
    return out


def widths(best: Sequence[Sample], keys: Sequence[Key], tolerance: float
            ) -> dict[Key, float]:
    """How far a change's run may be off a condition's speed and still count as run in it:
    SPEED_Z times the spread of the incumbent's own speeds there (three runs or more), within
    WIDTH_FLOOR and the tolerance. On a time budget the metric follows the speed: a condition
    whose runs agree closely must not take a run at a speed it never showed."""
    out: dict[Key, float] = {}
    for key in dict.fromkeys(keys):
        logs = [math.log(b.throughput) for b, k in zip(best, keys, strict=True)
                if k == key and b.throughput is not None and b.throughput > 0]
        if len(logs) < 3:
            out[key] = tolerance
            continue
        m = sum(logs) / len(logs)
        sd = math.sqrt(sum((v - m) ** 2 for v in logs) / (len(logs) - 1))
        out[key] = min(tolerance, max(WIDTH_FLOOR, math.expm1(SPEED_Z * sd)))
    return out


def latest_before(c: Sample, best: Sequence[Sample], any_device: bool = False) -> int | None:
    """The incumbent's latest run on the change run's device started before it."""
    found = None
    for i, b in enumerate(best):
        if (any_device or b.device == c.device) and (
                not c.run_id or not b.run_id or b.run_id < c.run_id):
            found = i
    return found


def speed_text(value: float | None, source: str | None = None) -> str:
    if value is None:
        return "speed unknown"
    return f"{value:.4g}/s" + (f" ({source})" if source else "")


def off(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return ""
    return f", {value / reference - 1:+.0%} vs the incumbent's {reference:.4g}/s"


def incumbent_notes(best: Sequence[Sample], keys: Sequence[Key]) -> list[str]:
    """Per incumbent run: the change's run it ran beside, and its speed when it is off the
    usual condition's."""
    speeds, usual = levels(best, keys), usual_keys(keys)
    notes = []
    for b, key in zip(best, keys, strict=True):
        parts = [f"beside run {b.pair_of} (seed {b.seed})"] if b.pair_of else []
        home = usual.get(key[0])
        if home is not None and key != home:
            gap = off(b.throughput, speeds.get(home))
            parts.append(f"{speed_text(b.throughput, b.source)}{gap}: another machine condition")
        notes.append("; ".join(parts))
    return notes


