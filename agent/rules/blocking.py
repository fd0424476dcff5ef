"""Blocking in time: which runs of a change and of its incumbent were measured in the same
machine conditions, and the change's gain estimated within them.

Pure: the stdlib only. On a time budget a busy stretch of the machine trains
fewer steps and measures a worse metric, for every commit alike; its throughput says so. The
incumbent's runs are grouped by throughput level per device (its *conditions*; the largest is
its usual one). Each run of a change is placed in one condition:

- beside an incumbent run started for it (same seed, same device, right after): that run's
  condition — so a changed speed counts as the change's own only when the incumbent, re-run
  in the same window, kept its old speed;
- else, with the change's previous run when their speeds agree (the machine did not move);
- else (its first run) with the incumbent's latest run on the device when its speed matches
  that condition's;
- else it has no comparison yet: the incumbent runs next, beside it (`pending`).

A condition whose incumbent runs beside this change disagree in metric with its older ones
(a shift the throughput did not show) is compared on the runs beside the change only. The
gain is the inverse-variance mean of the per-condition gains: one condition is the plain
two-sample comparison; a change and an incumbent run side by side are a same-window pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

from agent.rules.estimate import Obs, Stratum

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


@dataclass(frozen=True)
class Blocks:
    strata: tuple[Stratum, ...]
    back_to_back: tuple[tuple[Obs, ...], ...]  # the change's and beside runs per condition
    spread: tuple[tuple[Obs, ...], ...]  # the incumbent's older runs per condition
    pending: int | None  # index of the change's latest run when it has no comparison yet
    unconfirmed: bool  # its latest run's own speed waits for its next run (no keep yet)
    suspect: tuple[bool, ...]  # per change run: not in the incumbent's usual condition
    notes: tuple[str, ...]  # per change run: how it was placed
    best_suspect: tuple[bool, ...]  # per incumbent run: not in its usual condition
    best_notes: tuple[str, ...]  # per incumbent run: what it was (beside which run, where)
    usual: tuple[float, ...]  # the incumbent's runs in its usual condition

    @property
    def n(self) -> int:
        return sum(len(s.change) for s in self.strata)


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


def _levels(best: Sequence[Sample], keys: Sequence[Key]) -> dict[Key, float | None]:
    out: dict[Key, float | None] = {}
    for key in dict.fromkeys(keys):
        values = [b.throughput for b, k in zip(best, keys, strict=True)
                  if k == key and b.throughput is not None]
        out[key] = median(values) if values else None
    return out


def _widths(best: Sequence[Sample], keys: Sequence[Key], tolerance: float
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


def _latest_before(c: Sample, best: Sequence[Sample], any_device: bool = False) -> int | None:
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


def _off(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return ""
    return f", {value / reference - 1:+.0%} vs the incumbent's {reference:.4g}/s"


def incumbent_notes(best: Sequence[Sample], keys: Sequence[Key]) -> list[str]:
    """Per incumbent run: the change's run it ran beside, and its speed when it is off the
    usual condition's."""
    levels, usual = _levels(best, keys), usual_keys(keys)
    notes = []
    for b, key in zip(best, keys, strict=True):
        parts = [f"beside run {b.pair_of} (seed {b.seed})"] if b.pair_of else []
        home = usual.get(key[0])
        if home is not None and key != home:
            off = _off(b.throughput, levels.get(home))
            parts.append(f"{speed_text(b.throughput, b.source)}{off}: another machine condition")
        notes.append("; ".join(parts))
    return notes


@dataclass
class _Held:
    """A change's run whose pair disagreed in speed, until its next run tells."""

    index: int
    key: Key  # the incumbent's condition beside it
    ratio: float | None  # its speed over the incumbent's beside it; None: a credit


class _Placer:
    """place(): each run of a change put in one of the incumbent's conditions, in order."""

    def __init__(self, runs: Sequence[Sample], best: Sequence[Sample], keys: Sequence[Key],
                 tolerance: float) -> None:
        self.runs, self.best, self.keys, self.tol = runs, best, keys, tolerance
        self.levels, self.usual = _levels(best, keys), usual_keys(keys)
        self.widths = _widths(best, keys, tolerance)
        self.placed: list[Key | None] = []
        self.notes: list[str] = []
        self.own: list[bool] = []  # its speed is the change's own (confirmed)
        self.held: _Held | None = None

    def add(self, j: int, c: Sample) -> None:
        beside = [i for i, b in enumerate(self.best) if c.run_id and b.pair_of == c.run_id]
        held, self.held = self.held, None
        if held is not None and held.ratio is None:
            self._credit(held, c)
        if held is not None and held.ratio is not None:
            if not beside:  # it tells only beside the incumbent too: that run comes first
                self._put(None, False, f"{speed_text(c.throughput, c.source)}: whether run "
                          f"{self.runs[held.index].run_id} ran at the change's own speed "
                          "shows beside the incumbent; it runs beside this one", )
                self.held = held
                return
            if self._ratio(held, c, self.best[beside[0]], self.keys[beside[0]]):
                return
        if beside:
            b = self.best[beside[0]]
            key, note, new = _beside(c, b, self.keys[beside[0]], self.levels,
                                     self.usual.get(c.device), self.tol)
            if new is not None:
                self.held = _Held(j, new, None if key is not None else _ratio_of(c, b))
            self._put(key, False, note)
            return
        self._unpaired(j, c)

    def _credit(self, held: _Held, c: Sample) -> None:
        """A run beside the incumbent at its usual speed: its own speed if `c` keeps it."""
        w = held.index
        if agrees(c.throughput, self.runs[w].throughput, self.widths.get(held.key, self.tol)):
            self.own[w] = True
            self.notes[w] += "; its next run kept that speed: the change's own"
        else:
            self.placed[w] = None
            self.notes[w] += (f"; its next run ran at {speed_text(c.throughput)}: the machine "
                              "moved; left out")

    def _ratio(self, held: _Held, c: Sample, b: Sample, key: Key) -> bool:
        """Two runs of the change beside the incumbent off its usual speed: the same ratio of
        speeds twice is the change's own speed in those conditions (both placed there);
        another ratio says the machine moved (the first is left out). Whether `c` is placed."""
        w, ratio = held.index, _ratio_of(c, b)
        if ratio is None or not agrees(ratio, held.ratio, self.tol):
            self.notes[w] += "; the next pair's speeds differ otherwise: the machine moved"
            return False
        self.placed[w], self.own[w] = held.key, True
        self.notes[w] += "; the next pair's speeds differ alike: the change's own speed there"
        self._put(key, True, f"{speed_text(c.throughput, c.source)}; incumbent run {b.run_id} "
                  f"beside it ran at {speed_text(b.throughput)}: the change's own speed, as "
                  f"beside run {self.runs[w].run_id}; compared in those conditions")
        return True

    def _unpaired(self, j: int, c: Sample) -> None:
        prev_key = self.placed[-1] if j else None
        if prev_key is not None and agrees(c.throughput, self.runs[j - 1].throughput,
                                           self.widths.get(prev_key, self.tol)):
            note = "" if prev_key == self.usual.get(c.device) else (
                f"{speed_text(c.throughput, c.source)}, as its run {self.runs[j - 1].run_id} "
                "before: in the same other machine conditions")
            self._put(prev_key, self.own[-1], note)
        elif j == 0:
            self._first(c)
        else:
            self._put(None, False, f"{speed_text(c.throughput, c.source)} vs "
                      f"{speed_text(self.runs[j - 1].throughput)} for its run before (beyond "
                      f"±{self.tol:.0%}): the machine moved; the incumbent runs beside it")

    def _first(self, c: Sample) -> None:
        prev = _latest_before(c, self.best, any_device=c.throughput is None)
        if prev is None:
            self._put(None, False, "no incumbent run on its device: the incumbent runs beside it")
            return
        ref, key = self.levels.get(self.keys[prev]), self.keys[prev]
        width = self.widths.get(key, self.tol)
        if not agrees(c.throughput, ref, width):
            self._put(None, False, f"{speed_text(c.throughput, c.source)}{_off(c.throughput, ref)}"
                      f" (beyond ±{width:.0%}): the machine or the change? the incumbent runs "
                      "beside it")
        elif key != self.usual.get(c.device):
            self._put(key, False, f"{speed_text(c.throughput, c.source)}: at the incumbent's "
                      f"speed in its latest conditions (run {self.best[prev].run_id}, another "
                      "machine condition): compared there")
        else:
            self._put(key, False, "")

    def _put(self, key: Key | None, own: bool, note: str) -> None:
        self.placed.append(key)
        self.own.append(own)
        self.notes.append(note)


def _ratio_of(c: Sample, b: Sample) -> float | None:
    if c.throughput is None or b.throughput is None or b.throughput <= 0:
        return None
    return c.throughput / b.throughput


def place(runs: Sequence[Sample], best: Sequence[Sample], keys: Sequence[Key],
          tolerance: float) -> tuple[list[Key | None], list[str], bool, list[bool]]:
    """Each run of the change: its condition (None: not comparable) and why; whether the
    latest placed run's speed still waits to be confirmed as the change's own; and, per run,
    whether its speed is the change's own (confirmed: credited)."""
    p = _Placer(runs, best, keys, tolerance)
    for j, c in enumerate(runs):
        p.add(j, c)
    waiting = p.held is not None and p.held.ratio is None
    return p.placed, p.notes, waiting, p.own


def _beside(c: Sample, b: Sample, key: Key, levels: dict[Key, float | None],
            home: Key | None, tolerance: float) -> tuple[Key | None, str, Key | None]:
    """A change's run and the incumbent's run beside it: (condition, note, condition held
    until the change's next run). The same conditions when their speeds agree (the
    machine's, whatever it was). When they disagree and the incumbent kept its usual speed,
    the changed speed is the change's own if its next run keeps it (till then it counts in
    the usual conditions for a discard, not for a keep); when they disagree and the
    incumbent's speed moved too, the machine moved between them, or the change has its own
    speed there: its next pair tells (the same ratio of speeds), till then it is left out."""
    ref = levels.get(home) if home is not None else None
    head = (f"{speed_text(c.throughput, c.source)}{_off(c.throughput, ref)}; incumbent run "
            f"{b.run_id} beside it (seed {b.seed}) ran at {speed_text(b.throughput)}")
    if agrees(c.throughput, b.throughput, tolerance):
        note = "" if key == home else f"{head}: the machine; compared in those conditions"
        return key, note, None
    if key == home:
        return key, f"{head}, its usual speed: the change's own, if its next run keeps it", key
    return None, (f"{head}: off each other and off its usual speed too: the machine moved "
                  "between them, or the change has its own speed there; its next pair tells"), key


def arrange(runs: Sequence[Sample], best: Sequence[Sample], tolerance: float) -> Blocks:
    """The change's runs placed in the incumbent's conditions (see the module docstring)."""
    keys = conditions(best, tolerance)
    placed, notes, unconfirmed, credited = place(runs, best, keys, tolerance)
    usual = usual_keys(keys)
    mine = {c.run_id for c in runs if c.run_id}
    strata, together, spread = [], [], []
    for key in dict.fromkeys([*keys, *[k for k in placed if k is not None]]):
        change = tuple(_obs(c) for c, k in zip(runs, placed, strict=True) if k == key)
        inc = [(b, b.pair_of in mine) for b, k in zip(best, keys, strict=True) if k == key]
        beside = tuple(_obs(b) for b, side in inc if side)
        older = tuple(_obs(b) for b, side in inc if not side)
        together += [g for g in (change, beside) if len(g) >= 2]
        spread += [older] if len(older) >= 2 else []
        if change and (beside or older):
            ids = tuple(b.run_id for b, side in inc if side)
            own = any(o for o, k in zip(credited, placed, strict=True) if k == key)
            strata.append(Stratum(key, change, beside, older, ids, key == usual.get(key[0]), own))
    last = len(runs) - 1
    untried = runs and placed[last] is None and not any(
        b.pair_of == runs[last].run_id for b in best if runs[last].run_id)
    return Blocks(
        strata=tuple(strata),
        back_to_back=tuple(together),
        spread=tuple(spread),
        pending=last if untried else None,
        unconfirmed=unconfirmed,
        suspect=tuple(k is None or k != usual.get(k[0]) for k in placed),
        notes=tuple(notes),
        best_suspect=tuple(k != usual.get(k[0]) for k in keys),
        best_notes=tuple(incumbent_notes(best, keys)),
        usual=tuple(usual_runs(best, tolerance)),
    )


def _obs(r: Sample) -> Obs:
    speed = r.throughput
    return r.metric, (math.log(speed) if speed is not None and speed > 0 else None)
