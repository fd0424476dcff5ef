"""The sweep's digest (agent.analysis.insights' Insights) as running state: `digest` folds a sweep's
finished experiments in id order, then reads `insights` with the open ones; the sweep page keeps
a fold and adds each finish to it.

Pure, like agent.analysis.insights. What the digest sums (counts, per-knob trials, per-area tallies
and best, per-category runs, crash groups, the gains behind the noise scale, near-miss
candidates in order) is kept and appended to; what needs the whole sweep (the noise scale, the
near-miss tolerance, each knob's effects) is worked out again from that state, and a knob's
insight only when its trials or the scale it depends on moved. A fold advanced finish by
finish equals `digest` over the same experiments (tests/test_sweep_fold.py, on a real store).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from agent.analysis.folds import Ordered, appended
from agent.analysis.insights import (
    MAX_NEAR_MISSES,
    CrashKey,
    Insights,
    KnobInsight,
    _direction_word,
    _knob,
    area_insight,
    category_shares,
    crash_key,
    crash_line,
    near_miss_text,
    plateau_text,
    scale_notes,
)
from agent.analysis.trials import RUN_STATUSES, Trial, gain_scale, trial
from agent.core.config import Direction
from agent.core.domain import Experiment, ExperimentStatus, Sweep
from agent.rules.categories import Category, category_of, counted_category, exhausted_in

S = ExperimentStatus


@dataclass(frozen=True)
class _Area:
    runs: int = 0
    kept: int = 0
    crashed: int = 0
    top: Trial | None = None


@dataclass
class DigestFold:
    """Running state of a sweep's digest; `copy` before adding to one that is shared."""

    direction: Direction
    items: list[Trial] = field(default_factory=list)
    generation: int = 0  # keeps so far
    last_keep: int = -1  # index in items of the last keep
    last_kept_id: int | None = None
    gains: Ordered = field(default_factory=Ordered)
    counts: Counter[str] = field(default_factory=Counter)  # finished, not the baseline
    used: Counter[Category] = field(default_factory=Counter)  # categories.counts, finished
    knobs: dict[str, list[Trial]] = field(default_factory=dict)
    knob_gains: dict[tuple[str, str], int] = field(default_factory=dict)
    knob_memo: dict[str, tuple[object, KnobInsight]] = field(default_factory=dict)
    areas: dict[str, _Area] = field(default_factory=dict)
    near: Ordered = field(default_factory=Ordered)  # discarded: (-gain, index, trial)
    crashes: dict[CrashKey, list[Trial]] = field(default_factory=dict)
    crash_memo: dict[CrashKey, tuple[int, str]] = field(default_factory=dict)
    cat_runs: dict[Category, int] = field(default_factory=dict)
    cat_kept: dict[Category, int] = field(default_factory=dict)
    owned: set[object] = field(default_factory=set)  # lists this holder made (folds.py)

    def copy(self) -> DigestFold:
        """A copy to add to: the lists and tallies it shares are replaced, not changed, when
        it first adds to them (agent.analysis.folds)."""
        return DigestFold(
            self.direction, list(self.items), self.generation, self.last_keep,
            self.last_kept_id, self.gains.copy(), Counter(self.counts), Counter(self.used),
            dict(self.knobs), dict(self.knob_gains), dict(self.knob_memo), dict(self.areas),
            self.near.copy(), dict(self.crashes), dict(self.crash_memo), dict(self.cat_runs),
            dict(self.cat_kept))

    def add(self, e: Experiment) -> None:
        """Fold one finished experiment (after every one with a lower id)."""
        category = counted_category(e)
        if category is not None:
            self.used[category] += 1
        if e.is_baseline:
            return
        self.counts[e.status.value] += 1
        if e.status not in RUN_STATUSES:
            return
        t = trial(e, self.direction, self.generation)
        self.items.append(t)
        if t.kept:
            self.generation += 1
            self.last_keep, self.last_kept_id = len(self.items) - 1, e.id
        if t.gain is not None:
            self.gains.add(t.gain)
            if t.status is S.DISCARDED:
                self.near.add((-t.gain, len(self.items), t))
        self._add_knob_or_area(t, e)
        if t.crash is not None:
            key = crash_key(t)
            appended(self.crashes, self.owned, "crash", key, t)
        cat = category_of(e, [c.name for c in t.changes])
        self.cat_runs[cat] = self.cat_runs.get(cat, 0) + 1
        self.cat_kept[cat] = self.cat_kept.get(cat, 0) + t.kept

    def _add_knob_or_area(self, t: Trial, e: Experiment) -> None:
        if t.pure and len(t.changes) == 1:
            name = t.changes[0].name
            appended(self.knobs, self.owned, "knob", name, t)
            if t.gain is not None:
                k = (name, _direction_word(t))
                self.knob_gains[k] = self.knob_gains.get(k, 0) + 1
            return
        if t.pure:
            return
        category = category_of(e).value
        was = self.areas.get(category, _Area())
        top = t if t.gain is not None and (was.top is None or t.gain > (was.top.gain or 0.0)) \
            else was.top
        self.areas[category] = _Area(was.runs + 1, was.kept + t.kept,
                                     was.crashed + t.crashed, top)

    def insights(self, sweep: Sweep, open_experiments: list[Experiment]) -> Insights:
        """The digest of the folded experiments and these open (queued, running) ones."""
        scale = gain_scale(self.gains.values(), sweep.min_delta, ordered=True)
        tolerance = max(sweep.min_delta, 0.5 * scale) if scale is not None else sweep.min_delta
        counts, used = Counter(self.counts), Counter(self.used)
        for e in open_experiments:
            category = counted_category(e)
            if category is not None:
                used[category] += 1
            if not e.is_baseline:
                counts[e.status.value] += 1
        capped = exhausted_in(used, dict(sweep.config.category_shares), sweep.max_experiments) \
            if sweep.config.category_shares else {}
        return Insights(
            sweep=sweep.name, metric=sweep.metric, direction=sweep.direction.value,
            baseline=sweep.baseline_metric, best=sweep.best_metric,
            counts={k: n for k, n in counts.items() if n},
            noise_scale=None if scale is None else round(scale, 9),
            plateau=plateau_text(len(self.items) - 1 - self.last_keep, self.last_kept_id),
            knobs=self._knob_insights(scale), areas=self._area_insights(),
            near_misses=near_miss_text(self._near_misses(tolerance), self.generation),
            crash_lessons=self._crash_lines(),
            categories=category_shares(self.cat_runs, self.cat_kept, capped),
            notes=scale_notes(scale, tolerance))

    def _knob_insights(self, scale: float | None) -> list[KnobInsight]:
        out = []
        for name, ts in self.knobs.items():
            lone = any(n == 1 for (k, _), n in self.knob_gains.items() if k == name)
            key = (len(ts), scale if lone else None)
            hit = self.knob_memo.get(name)
            if hit is None or hit[0] != key:
                hit = self.knob_memo[name] = (key, _knob(name, ts, scale))
            out.append(hit[1])
        return sorted(out, key=lambda k: -max((abs(e.mean_gain) for e in k.effects), default=0.0))

    def _area_insights(self) -> list:  # type: ignore[type-arg]
        return [area_insight(c, a.runs, a.kept, a.crashed, a.top)
                for c, a in sorted(self.areas.items())]

    def _near_misses(self, tolerance: float) -> list[Trial]:
        found = []
        for _, _, t in self.near.values()[:MAX_NEAR_MISSES]:
            if t.gain is None or t.gain < -tolerance:
                break
            found.append(t)
        return found

    def _crash_lines(self) -> list[str]:
        out = []
        for key, ts in self.crashes.items():
            hit = self.crash_memo.get(key)
            if hit is None or hit[0] != len(ts):
                hit = self.crash_memo[key] = (len(ts), crash_line(key, ts))
            out.append(hit[1])
        return out


def digest(sweep: Sweep, history: list[Experiment]) -> Insights:
    """Everything the sweep has taught so far (history: the sweep's experiments, oldest first)."""
    fold = DigestFold(sweep.direction)
    for e in history:
        if e.status.is_finished():
            fold.add(e)
    return fold.insights(sweep, [e for e in history if not e.status.is_finished()])
