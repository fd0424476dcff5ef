"""The sweep's memory: a compact digest of what was tried and learned, for models and people.

Pure: built from a Sweep and its experiments only (no files, no database), so it is always current.
Per knob: runs, values, effect per direction with its standard error; other changes per category;
near-misses; crash lessons; plateau status; categories over-explored or capped. `digest`
(agent.analysis.insights_fold) builds it by folding the experiments in; `render` writes it as plain
text within a character budget, most useful lines first; the LLM prompt, the MCP tool
`get_insights`, `GET /sweeps/{name}/insights`, the dashboard and the CLI's end-of-night summary all
show this same digest.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.analysis.trials import PLATEAU_AFTER, Trial
from agent.core.domain import stopped_at
from agent.rules.categories import Category, category_of_knob
from agent.rules.knob_space import parse_literal

MAX_VALUES = 8
MAX_NEAR_MISSES = 5
OVER_EXPLORED_SHARE = 0.5  # a category with more than half the runs ...
OVER_EXPLORED_MIN_RUNS = 8  # ... once this many runs are counted


@dataclass(frozen=True)
class DirectionEffect:
    direction: str  # up | down | on | off
    runs: int
    mean_gain: float  # > 0 improved the metric (over the measured runs; 0 when none was)
    stderr: float | None
    kept: int
    stopped: int = 0  # of `runs`, changes the early stop ended: never measured, in no gain


@dataclass(frozen=True)
class KnobInsight:
    name: str
    category: str
    runs: int
    kept: int
    crashed: int
    current: str
    values: list[str]
    effects: list[DirectionEffect]


@dataclass(frozen=True)
class AreaInsight:
    category: str
    runs: int
    kept: int
    crashed: int
    best: str | None  # the best of them: "#12 use SwiGLU (better than the incumbent runs …)"


@dataclass(frozen=True)
class CategoryShare:
    category: str
    runs: int
    share: float
    kept: int
    note: str  # "", "over-explored: ...", "exhausted: ..."


@dataclass(frozen=True)
class Insights:
    sweep: str
    metric: str
    direction: str
    baseline: float | None
    best: float | None
    counts: dict[str, int]
    noise_scale: float | None
    plateau: str
    knobs: list[KnobInsight]
    areas: list[AreaInsight]
    near_misses: list[str]
    crash_lessons: list[str]
    categories: list[CategoryShare]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- per knob ----------------------------------------------------------------------------------
def _direction_word(t: Trial) -> str:
    c = t.changes[0]
    if c.old in ("True", "False") or c.new in ("True", "False"):
        return "on" if c.new == "True" else "off"
    return "up" if c.direction > 0 else "down"


@functools.lru_cache(maxsize=128)  # a sweep has a few knobs × directions
def _mean_sd(gains: tuple[float, ...]) -> tuple[float, float | None]:
    """Exact mean and standard deviation (statistics: slow on thousands of gains; after a
    finish only the group it joined has new gains, the others are read from here)."""
    return statistics.mean(gains), statistics.stdev(gains) if len(gains) >= 2 else None


def _effect(direction: str, items: list[Trial], scale: float | None) -> DirectionEffect:
    gains = tuple(t.gain for t in items if t.gain is not None)
    mean, sd = _mean_sd(gains) if gains else (0.0, None)
    if sd is not None:
        stderr: float | None = sd / math.sqrt(len(gains))
    else:
        stderr = scale / math.sqrt(len(gains)) if scale and gains else None
    return DirectionEffect(direction, len(items), round(mean, 9), None if stderr is None else
                           round(stderr, 9), sum(t.kept for t in items),
                           sum(stopped_at(t.meta) is not None for t in items))


def _knob(name: str, items: list[Trial], scale: float | None) -> KnobInsight:
    by_dir: dict[str, list[Trial]] = defaultdict(list)
    for t in items:
        by_dir[_direction_word(t)].append(t)
    values = list(dict.fromkeys(c.new for t in items for c in t.changes if c.name == name))
    kept = [c.new for t in items if t.kept for c in t.changes if c.name == name]
    current = kept[-1] if kept else items[0].changes[0].old
    return KnobInsight(name, category_of_knob(name).value, len(items), sum(t.kept for t in items),
                       sum(t.crashed for t in items), current, values[-MAX_VALUES:],
                       [_effect(d, ts, scale) for d, ts in sorted(by_dir.items())])


def area_insight(category: str, runs: int, kept: int, crashed: int, top: Trial | None
                 ) -> AreaInsight:
    best = f"#{top.id} {top.description[:60]} ({against_incumbent(top)})" if top and \
        top.gain is not None else None
    return AreaInsight(category, runs, kept, crashed, best)


def against_incumbent(t: Trial) -> str:
    """Its gain in words, the reference named, as every digest line says it: "better than
    the incumbent runs it was compared with by 0.0031 ± 0.002" (inferred)."""
    gain = t.gain or 0.0
    se = f" ± {t.se:.3g}" if t.se is not None else ""
    if gain == 0:
        return f"equal to the incumbent runs it was compared with{se}"
    return (f"{'better' if gain > 0 else 'worse'} than the incumbent runs it was compared "
            f"with by {abs(gain):.6f}{se}")


def near_miss_text(found: list[Trial], generation: int) -> list[str]:
    out = []
    for t in found:
        older = " (head has moved since: worth a re-test)" if t.generation < generation else ""
        out.append(f"#{t.id} {t.description[:70]}: {against_incumbent(t)}{older}")
    return out


CrashKey = tuple[str, int, str]


def crash_key(t: Trial) -> CrashKey:
    """The crash lesson a crashed trial belongs to: its knob and direction, or its change."""
    single = t.pure and len(t.changes) == 1
    return (t.changes[0].name, t.changes[0].direction, t.crash or "") if single else (
        t.description[:60], 0, t.crash or "")


def crash_line(key: CrashKey, ts: list[Trial]) -> str:
    what, direction, kind = key
    ids = ", ".join(f"#{t.id}" for t in ts[:4])
    new = ts[0].changes[0].new if direction else ""
    if new in ("True", "False"):
        what = f"{what} = {new}"
    elif direction:
        values = [float(parse_literal(t.changes[0].new)) for t in ts]
        edge = min(values) if direction > 0 else max(values)
        what = f"{what} {'≥' if direction > 0 else '≤'} {edge:g}"
    return f"{what}: {kind} ({ids}); avoid it"


# --- categories ------------------------------------------------------------------------------
def category_shares(runs: Mapping[Category, int], kept: Mapping[Category, int],
                    capped: Mapping[Category, str]) -> list[CategoryShare]:
    """Each category's share of the runs (trials per category, kept of them), most first."""
    total = sum(runs.values())
    keep_rate = sum(kept.values()) / total if total else 0.0
    out = []
    for cat in sorted(runs, key=lambda c: -runs[c]):
        share = runs[cat] / total
        note = f"exhausted: {capped[cat]}" if cat in capped else ""
        if not note and total >= OVER_EXPLORED_MIN_RUNS and share > OVER_EXPLORED_SHARE and \
                kept[cat] / runs[cat] <= keep_rate:
            note = f"over-explored: {share:.0%} of runs, keep rate no better than the sweep's"
        out.append(CategoryShare(cat.value, runs[cat], round(share, 4), kept[cat], note))
    return out


# --- the digest ------------------------------------------------------------------------------
def plateau_text(stall: int, last_kept: int | None) -> str:
    last = f"last keep #{last_kept}" if last_kept is not None else "nothing kept yet"
    if stall >= PLATEAU_AFTER:
        return (f"plateau: {stall} runs without a keep ({last}); change another knob or area, "
                "take a bigger step, or combine near-misses")
    return f"{stall} runs since the last keep ({last})"


def scale_notes(scale: float | None, tolerance: float) -> list[str]:
    if scale is None:
        return []
    return [f"near-miss = discarded, yet at most {tolerance:.3g} worse than the incumbent runs "
            "it was compared with (half the spread of the night's gains: changes' effects and "
            "noise together, not σ̂)"]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.6f}"


def _effect_text(e: DirectionEffect) -> str:
    stopped = f", {e.stopped} stopped early" if e.stopped else ""
    if e.stopped and e.stopped == e.runs:  # never measured: no gain to show (not "+0")
        return f"{e.direction}: stopped early over {e.runs} (not measured)"
    err = f" ± {e.stderr:.2g}" if e.stderr is not None else ""
    return f"{e.direction} {e.mean_gain:+.3g}{err} over {e.runs} ({e.kept} kept{stopped})"


def _knob_line(k: KnobInsight) -> str:
    effects = "; ".join(_effect_text(e) for e in k.effects)
    crashed = f", {k.crashed} crashed" if k.crashed else ""
    return (f"- {k.name} [{k.category}] now {k.current}; {k.runs} runs{crashed}; tried "
            f"{', '.join(k.values)}; gain by direction: {effects}")


def sections(ins: Insights) -> list[tuple[str, list[str]]]:
    """(heading, lines), most useful first."""
    runs = ", ".join(f"{n} {s}" for s, n in sorted(ins.counts.items())) or "none yet"
    better = "lower" if ins.direction == "minimize" else "higher"
    head = [f"{ins.metric} ({better} is better): baseline {_fmt(ins.baseline)}, best "
            f"{_fmt(ins.best)}; experiments: {runs}", ins.plateau, *ins.notes]
    cats = [f"- {c.category}: {c.runs} runs ({c.share:.0%}), {c.kept} kept"
            + (f" — {c.note}" if c.note else "") for c in ins.categories]
    areas = [f"- {a.category}: {a.runs} runs, {a.kept} kept, {a.crashed} crashed"
             + (f"; best {a.best}" if a.best else "") for a in ins.areas]
    return [
        (f"Sweep {ins.sweep}: what has been learned", head),
        ("Crash lessons (do not go there again)", [f"- {c}" for c in ins.crash_lessons]),
        ("Near-misses (discarded, but within the noise of the incumbent runs they were "
         "compared with)",
         [f"- {n}" for n in ins.near_misses]),
        ("Knobs tried (gain > 0 improved the metric; ± is the standard error)",
         [_knob_line(k) for k in ins.knobs]),
        ("Other changes by category", areas),
        ("Categories (share of runs)", cats),
    ]


def render(ins: Insights, max_chars: int = 6000) -> str:
    """The digest as text within max_chars: whole lines, later sections trimmed first."""
    out: list[str] = []
    used = 0
    for heading, lines in sections(ins):
        if not lines:
            continue
        block = [f"## {heading}"] if out else [f"# {heading}"]
        for line in lines:
            if used + sum(len(x) + 1 for x in block) + len(line) + 1 > max_chars:
                block.append("- (more omitted)")
                break
            block.append(line)
        cost = sum(len(x) + 1 for x in block)
        if used + cost > max_chars:
            break
        out += block
        used += cost
    return "\n".join(out)
