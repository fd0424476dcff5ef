"""Secondary metrics: the summary-block keys a target names in `[target] secondary`
(peak_vram_mb, tokens_per_s …), recorded on each run and shown beside the metric.

Pure: agent.core only. An experiment's secondary value is the mean of the runs its value rests
on (its record's `change.runs`: measured, like the metric), over those of them that reported the
key; a run the record does not name (set aside, an incumbent's) is in no mean. A key no such run
reported has no value ("–", never 0). The keep rule never reads these.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.core.bounds import finite_number
from agent.core.record import VerdictRecord

BLANK = "–"  # a key with no value (no run it rests on reported it)


def fmt_secondary(value: float | None) -> str:
    """A secondary value as every screen writes it: four significant digits, whole numbers from
    1000 up ("15813", never "1.581e+04"); "–" for none."""
    if value is None:
        return BLANK
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def run_value(summary: Mapping[str, Any], key: str) -> float | None:
    """The key's value in one run's summary: a finite number, else None (not printed); the
    same reading as a bound's (agent.core.bounds.finite_number)."""
    return finite_number(summary.get(key))


@dataclass(frozen=True)
class SecondaryMean:
    """One key's mean over the runs an experiment's value rests on that reported it."""

    key: str
    mean: float | None
    n: int  # how many of those runs reported it
    runs: tuple[int, ...] = ()  # their ids

    @property
    def text(self) -> str:
        return fmt_secondary(self.mean)

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean, "n": self.n}


def secondary_means(record: VerdictRecord | None, runs: Iterable[Any],
                    keys: Sequence[str]) -> tuple[SecondaryMean, ...]:
    """Per key, the mean of the runs `record` names as its change's (record.change.runs) that
    reported it, read from `runs` (Run records with their summaries; any others are ignored)."""
    named = record.change.runs if record is not None else ()
    wanted = set(named)
    by_id = {r.id: r for r in runs if r.id in wanted}
    out = []
    for key in keys:
        got = [(i, v) for i in named if i in by_id
               and (v := run_value(by_id[i].summary or {}, key)) is not None]
        values = [v for _, v in got]
        out.append(SecondaryMean(key, sum(values) / len(values) if values else None,
                                 len(values), tuple(i for i, _ in got)))
    return tuple(out)


def secondary_json(means: Sequence[SecondaryMean]) -> dict[str, dict[str, Any]]:
    """{"peak_vram_mb": {"mean": 40960.0, "n": 2}, …}: JSON-ready."""
    return {m.key: m.to_json() for m in means}


def by_experiment(experiments: Iterable[Any], runs: Iterable[Any],
                  keys: Sequence[str]) -> dict[int, tuple[SecondaryMean, ...]]:
    """secondary_means of each experiment (by id), from the sweep's runs; {} without keys."""
    if not keys:
        return {}
    own: dict[int, list[Any]] = {}
    for r in runs:
        own.setdefault(r.experiment_id, []).append(r)
    return {e.id: secondary_means(e.record, own.get(e.id, ()), keys) for e in experiments}
