"""Placement: the machine's conditions, the blocks of the keep rule's model
(docs/keep-rule.md#the-model). The incumbent's runs are grouped by speed, each run of a change is
placed in one of them (or not yet), and a commit's value is its runs in its most common
condition. Pure: stdlib, the record and agent.rules.noise and wording only; run records become
Samples in agent.rules.run_records.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

from agent.core.record import Measured
from agent.rules.noise import squared_deviations
from agent.rules.wording import other_speed_note, set_aside_note, unplaced_note

Condition = tuple[str | None, int]  # (device, the incumbent's condition on it)


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
    values: tuple[tuple[str, float], ...] = ()  # the summary-block keys its bounds read

    def value(self, key: str) -> float | None:
        return next((v for k, v in self.values if k == key), None)


@dataclass(frozen=True)
class Placement:
    """A change's runs placed in the incumbent's conditions."""

    keys: tuple[Condition | None, ...]  # per change run: its condition (None: not placed)
    notes: tuple[str, ...]  # per change run: how it was placed, when not plainly
    pending: bool  # its latest run is not placed and has no incumbent run beside it
    ratio_confirmed: bool  # its speed ratio is 1 or two pairs agree on it
    beside: int  # incumbent runs started beside its runs
    ratios: tuple[float, ...] = ()  # per pair: its run's speed over the incumbent run's


def agrees(value: float | None, reference: float | None, tolerance: float) -> bool:
    """Same speed within `tolerance` (a share of the reference); unknown speeds agree."""
    if value is None or reference is None or reference <= 0:
        return True
    return abs(value - reference) / reference <= tolerance


def conditions(best: Sequence[Sample], tolerance: float) -> list[Condition]:
    """Each incumbent run's condition (docs/keep-rule.md#the-model)."""
    keys: list[Condition] = []
    speeds: dict[Condition, list[float]] = {}
    latest: dict[str | None, Condition] = {}
    for b in best:
        key = latest.get(b.device)
        if key is None or not agrees(b.throughput, _median_speed(speeds[key]), tolerance):
            usual_key = _most_common_on(keys, b.device)
            usual_speeds = {usual_key: speeds[usual_key]} if usual_key else {}
            key = _nearest(b.throughput, b.device, usual_speeds, tolerance) or (
                b.device, sum(1 for k in speeds if k[0] == b.device))
        speeds.setdefault(key, [])
        if b.throughput is not None:
            speeds[key].append(b.throughput)
        latest[b.device] = key
        keys.append(key)
    return keys


def _median_speed(values: Sequence[float]) -> float | None:
    return median(values) if values else None


def _nearest(speed: float | None, device: str | None, speeds: dict[Condition, list[float]],
             tolerance: float) -> Condition | None:
    """The condition on `device` whose median speed is nearest `speed`, within tolerance."""
    if speed is None or speed <= 0:
        return None
    found, gap = None, math.inf
    for key, values in speeds.items():
        level = _median_speed(values)
        if key[0] != device or level is None or not agrees(speed, level, tolerance):
            continue
        if abs(math.log(speed / level)) < gap:
            found, gap = key, abs(math.log(speed / level))
    return found


def _most_common_on(keys: Sequence[Condition], device: str | None) -> Condition | None:
    return most_common([k for k in keys if k[0] == device])


def most_common(keys: Sequence[Condition]) -> Condition | None:
    """The condition with the most runs (the earliest on a tie)."""
    return max(dict.fromkeys(keys), key=keys.count) if keys else None


def usual_runs(best: Sequence[Sample], tolerance: float) -> tuple[Measured, list[bool]]:
    """The one definition of a commit's value (the best's, the baseline's): its runs in its
    usual condition, measured; and per run whether it is off that condition (set aside)."""
    keys = conditions(best, tolerance)
    usual_key = most_common(keys)
    on = [(b.run_id, b.metric) for b, k in zip(best, keys, strict=True) if k == usual_key]
    return (Measured(tuple(i for i, _ in on), tuple(v for _, v in on)),
            [k != usual_key for k in keys])


def best_of(best: Sequence[Sample], tolerance: float) -> tuple[float | None, list[bool]]:
    """The incumbent's value, the mean of its runs in its usual condition (usual_runs), and per
    run whether it is off that condition."""
    runs, off = usual_runs(best, tolerance)
    return runs.mean, off


@dataclass(frozen=True)
class _Incumbent:
    """The incumbent's conditions as a change's runs are placed in them."""

    keys: list[Condition]
    speeds: dict[Condition, list[float]]  # per condition, its runs' speeds
    latest: dict[str | None, Condition]  # per device, its latest condition

    @classmethod
    def of(cls, best: Sequence[Sample], tolerance: float) -> _Incumbent:
        keys = conditions(best, tolerance)
        speeds: dict[Condition, list[float]] = {}
        for b, k in zip(best, keys, strict=True):
            speeds.setdefault(k, []).extend([b.throughput] if b.throughput is not None else [])
        return cls(keys, speeds, {b.device: k for b, k in zip(best, keys, strict=True)})

    def conditions_to_join(self, device: str | None) -> dict[Condition, list[float]]:
        """The conditions a run not beside the incumbent may join: the usual and the latest."""
        return {k: v for k, v in self.speeds.items()
                if k in (_most_common_on(self.keys, device), self.latest.get(device))}


def blocks(runs: Sequence[Sample], keys: Sequence[Condition | None]) -> list[list[float]]:
    """The runs' metrics per condition (those in none left out)."""
    return [[r.metric for r, k in zip(runs, keys, strict=True) if k == key]
            for key in dict.fromkeys(k for k in keys if k is not None)]


def noise_part(runs: Sequence[Sample], tolerance: float) -> tuple[float, int]:
    """A commit's part of σ̂: the squared deviations of its runs within each condition
    (docs/keep-rule.md#the-model)."""
    return squared_deviations(blocks(runs, conditions(runs, tolerance)))


def place(runs: Sequence[Sample], best: Sequence[Sample], tolerance: float) -> Placement:
    """The change's runs placed in the incumbent's conditions (docs/keep-rule.md#the-model)."""
    inc = _Incumbent.of(best, tolerance)
    change_ids = {r.run_id for r in runs if r.run_id}
    pair = {b.pair_of: (b, k) for b, k in zip(best, inc.keys, strict=True)
            if b.pair_of in change_ids}
    usual_key = most_common(inc.keys)
    seen_apart = {k for b, k in zip(best, inc.keys, strict=True) if b.pair_of not in change_ids}
    ratios = {r.run_id: x for r in runs if r.run_id in pair
              and (x := _ratio(r, pair[r.run_id][0])) is not None}
    ratio = _own_ratio(ratios, pair, seen_apart, tolerance)
    placed = [_place_one(r, pair.get(r.run_id), ratio, inc, tolerance) for r in runs]
    level = _median_speed(inc.speeds.get(usual_key, [])) if usual_key is not None else None
    notes = [n or ("" if k in (None, usual_key) else other_speed_note(r.throughput, level,
                                                                           r.source))
             for r, (k, n) in zip(runs, placed, strict=True)]
    pending = bool(runs) and placed[-1][0] is None and runs[-1].run_id not in pair
    return Placement(tuple(k for k, _ in placed), tuple(notes), pending, ratio is not None,
                     len(pair), tuple(ratios.values()))


def _own_ratio(ratios: dict[int, float], pair: dict[int, tuple[Sample, Condition]],
               seen_apart: set[Condition], tolerance: float) -> float | None:
    """The change's speed over the incumbent's beside it, once two pairs agree on it (~1 when
    every pair says so): the median of the pairs whose incumbent run is in a condition known
    from runs not beside this change, or of pairs that agree while their incumbent runs ran in
    two or more conditions. A pair cancels the machine's speed; a ratio that holds while the
    machine's speed moved between pairs is the change's own. Pairs in one condition no run
    apart from them shows may each straddle the same change of load: they do not count."""
    measured = [x for i, x in ratios.items() if pair[i][1] in seen_apart]
    ratio = median(measured) if measured else 1.0
    if all(agrees(x, 1.0, tolerance) for x in ratios.values()) or sum(
            agrees(x, ratio, tolerance) for x in measured) >= 2:
        return ratio
    for x in sorted(ratios.values(), key=lambda x: -sum(agrees(y, x, tolerance)
                                                         for y in ratios.values())):
        held = [i for i, y in ratios.items() if agrees(y, x, tolerance)]
        if len(held) >= 2 and len({pair[i][1] for i in held}) >= 2:
            return median(ratios[i] for i in held)
    return None


def _ratio(r: Sample, b: Sample) -> float | None:
    """A change run's speed over the incumbent run's beside it (None: either unknown)."""
    return r.throughput / b.throughput if r.throughput and b.throughput else None


def _place_one(r: Sample, paired: tuple[Sample, Condition] | None, ratio: float | None,
               inc: _Incumbent, tolerance: float) -> tuple[Condition | None, str]:
    """One change run's condition and, when it is not plain, why; `ratio`: the change's
    speed ratio, None while it is not confirmed."""
    if paired is not None:
        b, key = paired
        if ratio is not None and not agrees(_ratio(r, b), ratio, tolerance):
            return None, set_aside_note(b.run_id)
        return key, ""
    if r.throughput is None:
        return inc.latest.get(r.device), ""
    found = None if ratio is None else _nearest(r.throughput / ratio, r.device,
                                                inc.conditions_to_join(r.device), tolerance)
    if found is not None:
        return found, ""
    return None, unplaced_note(r.throughput, r.source, ratio is not None)
