"""The pure parts of the morning: the attribution's verdicts and interaction sum, and when the
notifications' watch speaks (once per streak, plateau, pause and end)."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from agent.analysis.ablation import (
    BASELINE,
    BEST,
    HELPS,
    HURTS,
    LESS_TOGETHER,
    MINUS,
    MORE_TOGETHER,
    NO_LONGER,
    UNMEASURED,
    KeptChange,
    attribute,
    variant_keys,
)
from agent.analysis.morning_md import attribution_markdown
from agent.core.config import Direction, TargetConfig
from agent.core.domain import Experiment, ExperimentStatus, Sweep, SweepStatus
from agent.ops.notify import Watch

S = ExperimentStatus


def runs(mean: float, spread: float = 0.01) -> list[float]:
    return [mean - spread, mean, mean + spread]


def test_each_verdict_and_the_interaction_sum():
    kept = [KeptChange(1, "a", 0.30), KeptChange(2, "b", 0.00), KeptChange(3, "c", 0.10),
            KeptChange(4, "d", 0.10), KeptChange(5, "e", 0.05), KeptChange(6, "f", 0.2)]
    variants = {(BEST, None): runs(0.5), (BASELINE, None): runs(1.0),
                (MINUS, 1): runs(0.8),  # 0.3, as when kept
                (MINUS, 2): runs(0.8),  # 0.3 now, 0 when kept: works with another
                (MINUS, 3): runs(0.5),  # 0: no longer helps
                (MINUS, 4): runs(0.55),  # 0.05 of the 0.1 it gained when kept
                (MINUS, 5): runs(0.4)}  # without it, better: it hurts now
    a = attribute("x-ablate", Direction.MINIMIZE, kept, variants, night_sigma=0.01, seeds=3)
    verdicts = [c.verdict for c in a.changes]
    assert verdicts == [HELPS, MORE_TOGETHER, NO_LONGER, LESS_TOGETHER, HURTS, UNMEASURED]
    assert a.sigma == pytest.approx(0.01) and a.df == 14  # 7 variants × 2
    c = a.changes[0]
    assert c.gain == pytest.approx(0.3)
    assert c.ci == pytest.approx(1.96 * 0.01 * math.sqrt(2 / 3))
    assert a.total == pytest.approx(0.5) and a.runs == 21
    assert a.interaction is None  # one change has no variant: no sum
    # With every variant measured: Σ gains − total, its variance σ²(Σ1/n_i + 1/n_a + (K−1)²/n_b).
    done = {k: v for k, v in variants.items() if k != (MINUS, 5)}
    a = attribute("x-ablate", Direction.MINIMIZE, kept[:4], done, seeds=3)
    assert a.interaction == pytest.approx(0.3 + 0.3 + 0.0 + 0.05 - 0.5)
    assert a.interaction_ci == pytest.approx(1.96 * 0.01 * math.sqrt(4 / 3 + 1 / 3 + 9 / 3))
    assert a.additive is False and a.sum_of_gains == pytest.approx(0.65)


def test_maximize_turns_the_signs():
    kept = [KeptChange(1, "a", 0.2)]
    variants = {(BEST, None): runs(0.9), (BASELINE, None): runs(0.7), (MINUS, 1): runs(0.7)}
    a = attribute("x", Direction.MAXIMIZE, kept, variants, seeds=3)
    assert a.total == pytest.approx(0.2) and a.changes[0].gain == pytest.approx(0.2)
    assert a.changes[0].verdict == HELPS


def test_one_kept_change_counts_the_baseline_once():
    """With one kept change the best minus it is the baseline: one experiment under two keys.
    Its runs enter σ̂, its df and the runs spent once."""
    base, best = [3.62, 3.94, 3.87], [3.77, 3.70, 3.76]
    variants = {(BEST, None): best, (BASELINE, None): base, (MINUS, 2): list(base)}
    a = attribute("x-ablate", Direction.MINIMIZE, [KeptChange(2, "DEPTH 4 -> 2", 0.79)],
                  variants, seeds=3, samples=[best, base])
    assert a.runs == 6 and a.df == 4
    ss = sum((v - sum(g) / 3) ** 2 for g in (base, best) for v in g)
    assert a.sigma == pytest.approx(math.sqrt(ss / 4))
    assert a.changes[0].gain == pytest.approx(a.total)
    # There are no others to be on top of: the verdict says it was measured again.
    assert a.changes[0].verdict == "does not hold when measured again" and a.changes[0].flagged
    md = attribution_markdown(a)
    assert "gain over the baseline (± 95 %)" in md and "on top of the others" not in md
    # Without `samples` each key counts: the baseline's runs twice.
    assert attribute("x", Direction.MINIMIZE, [KeptChange(2, "d", 0.79)], variants).df == 6


def test_variant_keys_read_only_well_formed_meta():
    meta = {"ablation": {"keys": [["minus", 12], ["baseline", None], ["nonsense", 1], [1]]}}
    assert variant_keys(meta) == [(MINUS, 12), (BASELINE, None)]
    assert variant_keys({}) == [] and variant_keys({"ablation": "x"}) == []


def _sweep(status: SweepStatus = SweepStatus.RUNNING) -> Sweep:
    config = TargetConfig.from_dict({"command": "python t.py", "editable": ["t.py"],
                                     "metric": "m", "budget_s": 1})
    return Sweep(1, "n", "/t", "overnight/n", status, "knobs", config, None, 1.0, 1.0, None,
                 None, datetime(2026, 1, 1, tzinfo=UTC))


def _exp(i: int, status: ExperimentStatus, baseline: bool = False) -> Experiment:
    return Experiment(i, 1, status, f"change {i}", "", "knobs", is_baseline=baseline,
                      metric=1.0, best_before=1.1, crash_cause="CUDA out of memory"
                      if status is S.CRASHED else None)


def test_the_watch_speaks_once_per_occurrence():
    w, s = Watch(crash_streak=2, plateau_after=3), _sweep()
    said = [n.event for i, st in enumerate([S.KEPT, S.CRASHED, S.CRASHED, S.CRASHED,
                                            S.DISCARDED, S.REJECTED, S.KEPT, S.CRASHED], 2)
            for n in w.finished(s, _exp(i, st))]
    # keep; the streak at its 2nd crash (not again at the 3rd); the plateau at the 3rd run
    # without a keep; a refusal says nothing; keep.
    assert said == ["keep", "crash_streak", "plateau", "keep"]
    assert w.finished(s, _exp(20, S.KEPT, baseline=True)) == []
    assert [n.event for n in w.status(replace(s, status=SweepStatus.PAUSED))] == ["paused"]
    assert w.status(replace(s, status=SweepStatus.PAUSED)) == []
    assert w.status(s) == []  # resumed: nothing to say
    assert [n.event for n in w.status(replace(s, status=SweepStatus.DONE))] == ["done"]
    seeded = Watch(crash_streak=2)
    seeded.seed(s, [_exp(2, S.CRASHED)])  # a resumed sweep: one crash already in a row
    assert [n.event for n in seeded.finished(s, _exp(3, S.TIMEOUT))] == ["crash_streak"]
