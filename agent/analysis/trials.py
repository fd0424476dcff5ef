"""What a sweep's history says about its constants: which changed, by how much, with what gain.

Pure: reads Experiments (diffs, statuses, metrics) and never the files or the database.
Every experiment's constant changes are read from its diff, so proposals from any source
(the knobs proposer, a language model, a coding agent) teach the same lessons.
"""

from __future__ import annotations

import bisect
import functools
import math
import re
import statistics
import weakref
from dataclasses import dataclass

from agent.core.config import Direction
from agent.core.domain import RAN_STATUSES, CrashKind, Experiment, ExperimentStatus
from agent.core.record import Ending
from agent.rules.crash_causes import crash_family
from agent.rules.knob_space import direction_of, step_between

CONST_LINE = re.compile(
    r"^(?P<name>[A-Z][A-Z0-9_]*)(?P<sep>\s*(?::\s*\w+\s*)?=\s*)"
    r"(?P<value>True|False|[-+]?(?:\d[\d_]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?))"
    r"(?P<rest>\s*(?:#.*)?)$"
)
RUN_STATUSES = RAN_STATUSES  # kept and discarded first
# Runs without a keep after which a sweep is on a plateau (the search widens, the digest says so).
PLATEAU_AFTER = 6


@dataclass(frozen=True)
class Change:
    """One constant moved from `old` to `new` (literals as written)."""

    name: str
    old: str
    new: str

    # Computed once per change: constant_changes hands out the same Change for the same diff,
    # and a digest of a 10,000-experiment sweep asks each one again after every finish.
    @functools.cached_property
    def direction(self) -> int:
        return direction_of(self.name, self.old, self.new)

    @functools.cached_property
    def step(self) -> float | None:
        return step_between(self.name, self.old, self.new)


@dataclass(frozen=True)
class Trial:
    """One finished run (not the baseline) as the search sees it."""

    id: int
    status: ExperimentStatus
    description: str
    changes: tuple[Change, ...]
    pure: bool  # only constants changed (no other code)
    gain: float | None  # inferred: better than the incumbent runs it was compared with (> 0)
    # oom | nan | timeout | crash, for fundamental failures only; "over a bound": discarded
    # past a hard bound of [target.constraints] (a region the search avoids as a crash's)
    crash: str | None
    generation: int  # how many keeps came before it (which head it ran on)
    meta: dict[str, object]
    se: float | None = None  # the gain's standard error (None: the noise was not measured)

    @functools.cached_property  # read for every trial by several of a digest's sums
    def kept(self) -> bool:
        return self.status is ExperimentStatus.KEPT

    @property
    def crashed(self) -> bool:
        """A fundamental failure (a region to avoid that crashed), not a discard past a bound."""
        return self.crash is not None and self.crash != Ending.OVER_BOUND.value


def _constants(lines: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for line in lines:
        m = CONST_LINE.match(line.rstrip("\n"))
        if m:
            out[m.group("name")] = m.group("value")
    return out


@functools.lru_cache(maxsize=1 << 16)
def constant_changes(diff: str) -> tuple[tuple[Change, ...], bool]:
    """The constants a diff changes, and whether it changes nothing else (cached: the same
    history is read again for every proposal and every digest, so the cache holds a large
    sweep's diffs whole: one smaller than the sweep is read in order and never hits)."""
    removed: list[str] = []
    added: list[str] = []
    lines = diff.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            continue
        if line.startswith("+++ ") and i > 0 and lines[i - 1].startswith("--- "):
            continue
        if line.startswith("-"):
            removed.append(line[1:])
        elif line.startswith("+"):
            added.append(line[1:])
    old, new = _constants(tuple(removed)), _constants(tuple(added))
    changes = tuple(Change(n, old[n], new[n]) for n in new if n in old and old[n] != new[n])
    pure = len(removed) == len(old) and len(added) == len(new) and set(old) == set(new)
    return changes, pure and bool(changes)


def crash_class(exp: Experiment) -> str | None:
    """oom / nan / timeout / crash for a run that failed for a reason other than a code bug."""
    if exp.status is ExperimentStatus.TIMEOUT or exp.crash_kind is CrashKind.TIMEOUT:
        return "timeout"
    if exp.status is not ExperimentStatus.CRASHED or exp.crash_kind is CrashKind.TRIVIAL:
        return None
    # The cause classification recorded; a row from before the column has its reason, which
    # starts with the cause.
    return crash_family(exp.crash_cause or exp.reason or "")


def gain_of(exp: Experiment, direction: Direction) -> float | None:
    """Its gain over the incumbent runs it was compared with, as its record says (inferred;
    > 0 is better); None when it was not compared."""
    record = exp.record
    if record is None or record.difference is None or not math.isfinite(record.difference):
        return None
    return record.gain(direction is Direction.MINIMIZE)


# A sweep page's digest asks for every trial again after each finish, and its history hands
# over the same Experiment objects each time (frozen: what a trial is made of cannot change
# under it). So a trial is remembered per live object (dropped when the object goes) and
# reused while the direction and generation it was made with still hold.
_REMEMBERED: dict[int, tuple[weakref.ref[Experiment], Direction, int, Trial]] = {}


def trial(exp: Experiment, direction: Direction, generation: int) -> Trial:
    key = id(exp)
    hit = _REMEMBERED.get(key)
    if hit is not None and hit[0]() is exp and hit[1] is direction and hit[2] == generation:
        return hit[3]
    changes, pure = constant_changes(exp.diff)
    # past a hard bound: a region to avoid, as a crash is, and no gain the rule judged
    bound = exp.record is not None and exp.record.ending is Ending.OVER_BOUND
    gain = gain_of(exp, direction) if exp.status in RUN_STATUSES[:2] and not bound else None
    trial = Trial(exp.id, exp.status, exp.description, changes, pure, gain,
                  Ending.OVER_BOUND.value if bound else crash_class(exp),
                  generation, dict(exp.meta),
                  exp.record.se if gain is not None and exp.record is not None else None)
    gone = functools.partial(_forget, key)
    _REMEMBERED[key] = (weakref.ref(exp, gone), direction, generation, trial)
    return trial


def _forget(key: int, _: object) -> None:
    """The experiment remembered under `key` was freed: so is its trial."""
    _REMEMBERED.pop(key, None)


def trials(history: list[Experiment], direction: Direction) -> list[Trial]:
    """Finished runs, oldest first, each with its constant changes and gain."""
    out: list[Trial] = []
    generation = 0
    for exp in history:
        if exp.status not in RUN_STATUSES or exp.is_baseline:
            continue
        out.append(trial(exp, direction, generation))
        if exp.status is ExperimentStatus.KEPT:
            generation += 1
    return out


def noise_scale(items: list[Trial], min_delta: float = 0.0) -> float | None:
    """A robust scale of the gains (1.4826 × MAD): run-to-run noise plus the typical effect.

    None until four gains are known. Used to put gains in comparable units, never to decide.
    """
    return gain_scale([t.gain for t in items if t.gain is not None], min_delta)


def gain_scale(gains: list[float], min_delta: float = 0.0, ordered: bool = False
               ) -> float | None:
    """noise_scale of these gains (`ordered`: already sorted, as a digest's fold keeps them;
    then the median and the median absolute deviation are found by bisection, not a sort)."""
    if len(gains) < 4:
        return None
    ordered_gains = gains if ordered else sorted(gains)
    n = len(ordered_gains)
    mid = ordered_gains[n // 2] if n % 2 else \
        (ordered_gains[n // 2 - 1] + ordered_gains[n // 2]) / 2
    mad = _median_deviation(ordered_gains, mid)
    scale = 1.4826 * mad or statistics.mean([abs(g - mid) for g in ordered_gains])
    return max(scale, min_delta, 1e-12)


def _median_deviation(ordered: list[float], mid: float) -> float:
    """statistics.median(abs(g - mid) for g in ordered) for sorted gains: the deviations
    below `mid` and from it upwards are two sorted runs; their middle is found by bisection."""
    split = bisect.bisect_left(ordered, mid)
    below = _Deviations(ordered, mid, split, -1)  # nearest first
    above = _Deviations(ordered, mid, split, 1)
    n = len(ordered)
    if n % 2:
        return _kth_smallest(below, above, n // 2)
    return (_kth_smallest(below, above, n // 2 - 1) + _kth_smallest(below, above, n // 2)) / 2


class _Deviations:
    """|g − mid| for the gains on one side of `split`, nearest first (non-decreasing)."""

    def __init__(self, ordered: list[float], mid: float, split: int, step: int) -> None:
        self.ordered, self.mid, self.split, self.step = ordered, mid, split, step
        self.n = split if step < 0 else len(ordered) - split

    def __getitem__(self, i: int) -> float:
        at = self.split - 1 - i if self.step < 0 else self.split + i
        return abs(self.ordered[at] - self.mid)


def _kth_smallest(a: _Deviations, b: _Deviations, k: int) -> float:
    """The k-th smallest (from 0) of two non-decreasing sequences together."""
    lo, hi = max(0, k + 1 - b.n), min(k + 1, a.n)
    while lo < hi:  # i: how many of the k + 1 smallest come from a
        i = (lo + hi) // 2
        if a[i] < b[k - i]:
            lo = i + 1
        else:
            hi = i
    i, j = lo, k + 1 - lo
    return max(a[i - 1] if i > 0 else -math.inf, b[j - 1] if j > 0 else -math.inf)


def near_miss_tolerance(items: list[Trial], min_delta: float = 0.0) -> float:
    """How far below the best a discarded run may land and still count as a near-miss."""
    scale = noise_scale(items, min_delta)
    return max(min_delta, 0.5 * scale) if scale is not None else min_delta


def near_misses(items: list[Trial], min_delta: float = 0.0) -> list[Trial]:
    """Discarded runs within the tolerance of the best they were judged against, best first."""
    tol = near_miss_tolerance(items, min_delta)
    found = [t for t in items if t.status is ExperimentStatus.DISCARDED and t.gain is not None
             and t.gain >= -tol]
    return sorted(found, key=lambda t: -(t.gain or 0.0))


def since_last_keep(items: list[Trial]) -> int:
    """Runs finished since the last keep (all of them if nothing was kept)."""
    n = 0
    for t in reversed(items):
        if t.kept:
            break
        n += 1
    return n
