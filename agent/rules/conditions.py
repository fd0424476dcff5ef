"""The machine's conditions, the blocks of the keep rule's model: the incumbent's runs grouped by
speed, each run of a change placed in one of them (or not yet), and the incumbent's value.

Pure: stdlib and agent.rules.noise only.

On a time budget a busy stretch of a shared machine trains fewer steps and measures a worse
metric, for every commit alike; its throughput says so. A condition is such a stretch as the
incumbent's runs show it: per device, in start order, a run stays in the latest condition while
its throughput is within the tolerance of that condition's median, else joins the nearest
earlier one within the tolerance, else starts one. The usual condition is the one with the most
runs: the incumbent's value (the best) is the mean of its runs there.

A run of a change is placed:

- beside an incumbent run started for it (the pair: one stretch of time): in that run's
  condition, unless their speed ratio disagrees with the change's own (the machine moved
  between them: left out);
- else in the condition whose speed, times the change's speed ratio, matches its own
  (nearest first); the ratio is its speed over the incumbent's beside it (the median over its
  pairs), 1 before any pair. A ratio off 1 is trusted once two pairs agree on it; until then
  each run of the change gets its pair;
- else it is not placed yet: the incumbent runs beside it.

A run whose speed is unknown is placed in the incumbent's latest condition on its device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

Key = tuple[str | None, int]  # (device, the incumbent's condition on it)


@dataclass(frozen=True)
class Sample:
    """One finished run with a finite metric, as the decision sees it."""

    metric: float
    throughput: float | None = None
    run_id: int = 0  # start order within the sweep (ids grow); 0: order of the tuple only
    seed: int | None = None
    device: str | None = None
    pair_of: int | None = None  # an incumbent run: the change's run it was started beside
    source: str | None = None  # where the throughput came from (agent.rules.throughput)


@dataclass(frozen=True)
class Placement:
    """A change's runs placed in the incumbent's conditions."""

    keys: tuple[Key | None, ...]  # per change run: its condition (None: not placed)
    notes: tuple[str, ...]  # per change run: how it was placed, when not plainly
    pending: bool  # its latest run is not placed and has no incumbent run beside it
    ratio_confirmed: bool  # its speed ratio is 1 or two pairs agree on it
    beside: int  # incumbent runs started beside its runs


def agrees(value: float | None, reference: float | None, tolerance: float) -> bool:
    """Same speed within `tolerance` (a share of the reference); unknown speeds agree."""
    if value is None or reference is None or reference <= 0:
        return True
    return abs(value - reference) / reference <= tolerance


def conditions(best: Sequence[Sample], tolerance: float) -> list[Key]:
    """Each incumbent run's condition (see the module docstring)."""
    keys: list[Key] = []
    speeds: dict[Key, list[float]] = {}
    latest: dict[str | None, Key] = {}
    for b in best:
        key = latest.get(b.device)
        if key is None or not agrees(b.throughput, _level(speeds[key]), tolerance):
            home = _usual_of(keys, b.device)
            key = _nearest(b.throughput, b.device, {home: speeds[home]} if home else {},
                           tolerance) or (b.device, sum(1 for k in speeds if k[0] == b.device))
        speeds.setdefault(key, [])
        if b.throughput is not None:
            speeds[key].append(b.throughput)
        latest[b.device] = key
        keys.append(key)
    return keys


def _level(values: Sequence[float]) -> float | None:
    return median(values) if values else None


def _nearest(speed: float | None, device: str | None, speeds: dict[Key, list[float]],
             tolerance: float) -> Key | None:
    """The condition on `device` whose median speed is nearest `speed`, within tolerance."""
    if speed is None or speed <= 0:
        return None
    found, gap = None, math.inf
    for key, values in speeds.items():
        level = _level(values)
        if key[0] != device or level is None or not agrees(speed, level, tolerance):
            continue
        if abs(math.log(speed / level)) < gap:
            found, gap = key, abs(math.log(speed / level))
    return found


def _usual_of(keys: Sequence[Key], device: str | None) -> Key | None:
    return usual([k for k in keys if k[0] == device])


def usual(keys: Sequence[Key]) -> Key | None:
    """The condition with the most runs (the earliest on a tie)."""
    return max(dict.fromkeys(keys), key=keys.count) if keys else None


def best_of(best: Sequence[Sample], tolerance: float) -> tuple[float | None, list[bool]]:
    """The incumbent's value, the mean of its runs in its usual condition, and per run
    whether it is off that condition."""
    keys = conditions(best, tolerance)
    home = usual(keys)
    values = [b.metric for b, k in zip(best, keys, strict=True) if k == home]
    return (sum(values) / len(values) if values else None), [k != home for k in keys]


def place(runs: Sequence[Sample], best: Sequence[Sample], tolerance: float) -> Placement:
    """The change's runs placed in the incumbent's conditions (see the module docstring)."""
    keys = conditions(best, tolerance)
    mine = {r.run_id for r in runs if r.run_id}
    pair = {b.pair_of: (b, k) for b, k in zip(best, keys, strict=True) if b.pair_of in mine}
    ratios = [x for r in runs if r.run_id in pair
              and (x := _ratio(r, pair[r.run_id][0])) is not None]
    ratio = median(ratios) if ratios else 1.0
    confirmed = agrees(ratio, 1.0, tolerance) or sum(
        agrees(x, ratio, tolerance) for x in ratios) >= 2
    speeds: dict[Key, list[float]] = {}
    latest: dict[str | None, Key] = {}
    for b, k in zip(best, keys, strict=True):
        speeds.setdefault(k, []).extend([b.throughput] if b.throughput is not None else [])
        latest[b.device] = k
    placed: list[Key | None] = []
    notes: list[str] = []
    for r in runs:
        key, note = _one(r, pair.get(r.run_id), ratio, confirmed, speeds, latest,
                         _usual_of(keys, r.device), tolerance)
        placed.append(key)
        notes.append(note)
    home = usual(keys)
    level = _level(speeds.get(home, [])) if home is not None else None
    notes = [n or ("" if k in (None, home) else _elsewhere(r, level))
             for r, k, n in zip(runs, placed, notes, strict=True)]
    last = runs[-1] if runs else None
    pending = last is not None and placed[-1] is None and last.run_id not in pair
    return Placement(tuple(placed), tuple(notes), pending, confirmed, len(pair))


def _elsewhere(r: Sample, usual_speed: float | None) -> str:
    """The note of a run placed in another machine condition than the usual one."""
    speed = "speed unknown" if r.throughput is None else f"{r.throughput:.4g}/s"
    usual = f" against the incumbent's usual {usual_speed:.4g}/s" if usual_speed else ""
    return (f"{speed}{usual}: the machine ran in another condition; compared with the "
            "incumbent's runs there")


def _ratio(r: Sample, b: Sample) -> float | None:
    """A change run's speed over the incumbent run's beside it (None: either unknown)."""
    return r.throughput / b.throughput if r.throughput and b.throughput else None


def _one(r: Sample, paired: tuple[Sample, Key] | None, ratio: float, confirmed: bool,
         speeds: dict[Key, list[float]], latest: dict[str | None, Key], home: Key | None,
         tolerance: float) -> tuple[Key | None, str]:
    """One change run's condition and, when it is not plain, why."""
    if paired is not None:
        b, key = paired
        if not agrees(_ratio(r, b), ratio, tolerance):
            return None, (f"left out: its speed over the incumbent's beside it (run "
                          f"{b.run_id}) differs from the change's other pairs: the machine "
                          "moved between them")
        return key, ""
    if r.throughput is None:
        return latest.get(r.device), ""
    if confirmed:
        near = {k: v for k, v in speeds.items() if k in (home, latest.get(r.device))}
        found = _nearest(r.throughput / ratio, r.device, near, tolerance)
        if found is not None:
            return found, ""
    return None, (f"{r.throughput:.4g}/s matches no condition the incumbent ran in"
                  + ("" if confirmed else " (the change's own speed is not confirmed yet)")
                  + ": the incumbent runs beside it")
