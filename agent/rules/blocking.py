"""Blocking in time: each run of a change placed in one of its incumbent's machine conditions
(agent.rules.conditions), and the change's runs and the incumbent's arranged per condition for
the gain (agent.rules.estimate).

Pure: the stdlib and agent.rules only. On a time budget a busy stretch of the machine trains
fewer steps and measures a worse metric, for every commit alike; its throughput says so. Each
run of a change is placed in one condition:

- beside an incumbent run started for it (same seed, same device, right after): that run's
  condition when their speeds agree; when they do not and the incumbent kept its usual speed,
  the changed speed is the change's own once its next run keeps it (till then it counts for a
  discard, not for a keep), or at once when an earlier run confirmed that speed as its own;
  when the incumbent's speed moved too, the change's own speed there only if its next pair
  shows the same ratio of speeds, else the machine moved between them;
- else, with the change's previous run when their speeds agree within its condition's width;
- else (its first run, or a later one whose speed left its previous run's while no speed of
  its own is confirmed) with the incumbent's latest condition on the device when its speed
  fits there;
- else it has no comparison yet: the incumbent runs next, beside it (`pending`).

A condition whose incumbent runs beside this change disagree in metric with its older ones (a
shift the throughput did not show) is compared on the runs beside the change only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agent.rules.conditions import (
    Key,
    Sample,
    agrees,
    conditions,
    incumbent_notes,
    latest_before,
    levels,
    off,
    speed_text,
    usual_keys,
    usual_runs,
    widths,
)
from agent.rules.estimate import Obs, Stratum

CONFIRM_SHARE = 0.75  # a credited speed is confirmed within this share of the tolerance (at most)

__all__ = ["Blocks", "Sample", "arrange", "conditions", "incumbent_notes", "place",
           "usual_keys", "usual_runs"]


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
        self.levels, self.usual = levels(best, keys), usual_keys(keys)
        self.widths = widths(best, keys, tolerance)
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
            again = self._own_speed(c, key) if new is not None and key is not None else None
            if again is not None:  # at a speed already confirmed as its own: no wait
                self._put(key, True, f"{note}; as its run {self.runs[again].run_id}, whose "
                          "speed was confirmed: the change's own")
                return
            if new is not None:
                self.held = _Held(j, new, None if key is not None else _ratio_of(c, b))
            self._put(key, False, note)
            return
        self._unpaired(j, c)

    def _own_speed(self, c: Sample, key: Key) -> int | None:
        """An earlier run of the change placed in `key` at its own (confirmed) speed that
        `c`'s speed agrees with, if any."""
        width = min(self.widths.get(key, self.tol), self.tol * CONFIRM_SHARE)
        for i in range(len(self.placed) - 1, -1, -1):
            if self.own[i] and self.placed[i] == key and agrees(
                    c.throughput, self.runs[i].throughput, width):
                return i
        return None

    def _credit(self, held: _Held, c: Sample) -> None:
        """A run beside the incumbent at its usual speed: its own speed if `c` keeps it."""
        w = held.index
        width = min(self.widths.get(held.key, self.tol), self.tol * CONFIRM_SHARE)
        if agrees(c.throughput, self.runs[w].throughput, width):
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
            moved = (f"{speed_text(c.throughput, c.source)} vs "
                     f"{speed_text(self.runs[j - 1].throughput)} for its run before (beyond "
                     f"±{self.tol:.0%}): the machine moved")
            if not any(self.own):  # no speed of its own yet: placed as a first run would be
                self._first(c)
                if self.placed[-1] is not None:
                    self.notes[-1] = f"{moved}; {self.notes[-1] or 'back at the usual speed'}"
                    return
                self.placed.pop(), self.own.pop(), self.notes.pop()
            self._put(None, False, f"{moved}; the incumbent runs beside it")

    def _first(self, c: Sample) -> None:
        prev = latest_before(c, self.best, any_device=c.throughput is None)
        if prev is None:
            self._put(None, False, "no incumbent run on its device: the incumbent runs beside it")
            return
        ref, key = self.levels.get(self.keys[prev]), self.keys[prev]
        width = self.widths.get(key, self.tol)
        if not agrees(c.throughput, ref, width):
            self._put(None, False, f"{speed_text(c.throughput, c.source)}{off(c.throughput, ref)}"
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
    head = (f"{speed_text(c.throughput, c.source)}{off(c.throughput, ref)}; incumbent run "
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
