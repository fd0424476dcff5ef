"""Futility: a run not ahead enough at a check is stopped as "not better" (agent.rules.prune
.futile), and a change whose repeats cannot plausibly reach the keep bar stops getting runs
(agent.rules.sequential.discard_bar)."""

from __future__ import annotations

import math

import pytest
from test_prune_rule import curve

from agent.core.domain import ExperimentStatus
from agent.rules.decide import Evidence, Rule, Sample, decide
from agent.rules.prune import PrunePolicy, check, futile
from agent.rules.sequential import discard_bar

INCUMBENTS = [curve(seed=s) for s in range(4)]
FUTILE = PrunePolicy(futile_z=(math.inf, 1.0, 0.5))


def level(offset: float) -> list[tuple[float, float]]:
    """The incumbents' mean curve, moved by `offset` (their spread is ~0.045)."""
    return [(pts[0][0], sum(p[1] for p in pts) / len(pts) + offset)
            for pts in zip(*INCUMBENTS, strict=True)]


def test_futility_is_off_unless_the_policy_sets_it() -> None:
    behind = level(0.08)
    for index in range(3):
        call = futile(behind, INCUMBENTS, index)
        assert not call.stop and not call.futile and call.why == "futility is off"


def test_a_run_behind_but_within_the_prune_margin_is_futile_and_not_better() -> None:
    behind = level(0.08)  # ~2 spreads behind: not clearly losing
    assert not check(behind, INCUMBENTS, 2, FUTILE).stop
    call = futile(behind, INCUMBENTS, 2, FUTILE)
    assert call.stop and call.futile and call.fraction == 0.7
    assert call.loss is not None and call.reference is not None and call.margin is not None
    assert call.loss - call.reference > call.margin
    assert call.margin < check(behind, INCUMBENTS, 2, FUTILE).margin  # type: ignore[operator]
    text = call.reason()
    assert text.startswith("not better: stopped at 70 % of the budget: loss ")
    assert text.endswith("not ahead enough to end significantly better")


def test_a_run_ahead_or_level_goes_on_and_inf_skips_a_check() -> None:
    for offset in (-0.2, 0.0):
        call = futile(level(offset), INCUMBENTS, 2, FUTILE)
        assert not call.stop and not call.futile and "ahead enough" in call.why
    far = level(0.15)
    assert not futile(far, INCUMBENTS, 0, FUTILE).stop  # futile_z inf at 30 %
    assert futile(far, INCUMBENTS, 1, FUTILE).stop


def test_futility_keeps_checks_guards() -> None:
    behind = level(0.08)
    assert not futile(behind, INCUMBENTS, 2, FUTILE, category="data/schedule").stop
    slow = futile(behind, INCUMBENTS, 2, FUTILE, speed_ratio=0.8)
    assert not slow.stop and "measures the machine" in slow.why
    assert not futile(behind, INCUMBENTS[:1], 2, FUTILE).stop
    assert futile(behind, INCUMBENTS, 2, FUTILE, category="architecture").stop


def test_check_is_unchanged_by_futility_settings() -> None:
    loser = curve(offset=1.0, seed=9)
    for index in range(3):
        a, b = check(loser, INCUMBENTS, index), check(loser, INCUMBENTS, index, FUTILE)
        assert a == b and a.stop and not a.futile


@pytest.mark.parametrize("kwargs", [dict(futile_z=(1.0,)), dict(futile_z=(1.0, math.nan, 1.0)),
                                    dict(futile_runs=-1)])
def test_a_bad_futility_policy_is_refused_by_name(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="prune policy"):
        PrunePolicy(**kwargs)  # type: ignore[arg-type]


def test_the_discard_bar_rises_to_the_keep_bar_with_futility() -> None:
    flat, rising = Rule(futility=0.0), Rule(futility=1.0)
    assert [discard_bar(flat, k) for k in range(1, 6)] == [0.6] * 5
    bars = [discard_bar(rising, k) for k in range(1, 6)]
    assert bars[0] == 0.6 and bars[3] == pytest.approx(1.75) and bars[4] == bars[3]
    assert bars == sorted(bars)
    half = Rule(futility=0.5)
    assert discard_bar(half, 4) == pytest.approx(0.6 + 0.5 * 1.15)
    assert Rule().futility == 0.5  # the default: half-way (docs/keep-rule.md)


BEST = tuple(Sample(m, run_id=i + 1, seed=42 + i) for i, m in enumerate((0.1, -0.1, 0.0)))


def _change(metrics: list[float]) -> Evidence:
    runs = tuple(Sample(m, run_id=10 + i, seed=42 + i) for i, m in enumerate(metrics))
    return Evidence(False, runs, BEST)


def test_a_change_that_cannot_reach_the_keep_bar_stops_getting_runs() -> None:
    # σ = 1: three runs 0.9 below the incumbent's mean of three, z = 0.9 / √(2/3) = 1.10
    ev = _change([-0.9, -0.9, -0.9])
    today = decide(ev, Rule(noise_sigma=1.0, futility=0.0))
    assert today.status is None and today.z == pytest.approx(1.10, abs=0.01)  # a fourth run
    futile_rule = Rule(noise_sigma=1.0, futility=1.0)  # bar after 3 runs: 1.37
    verdict = decide(ev, futile_rule)
    assert verdict.status is ExperimentStatus.DISCARDED and verdict.reason.startswith("not better")
    # a clearly better change is still kept, and the first run's bar is today's
    assert decide(_change([-2.5, -2.5]), futile_rule).status is ExperimentStatus.KEPT
    assert decide(_change([-0.9]), futile_rule).status is None  # z 0.78 ≥ 0.6


def test_the_spread_is_an_upper_bound_that_tightens_with_more_curves() -> None:
    loser = level(0.6)
    plain = PrunePolicy(spread_upper=0.0)
    few, many = INCUMBENTS[:3], [curve(seed=s) for s in range(12)]
    for incumbents in (few, many):
        bounded, raw = check(loser, incumbents, 0), check(loser, incumbents, 0, plain)
        assert bounded.spread is not None and raw.spread is not None
        assert bounded.spread > raw.spread
    def ratio(incumbents: list[list[tuple[float, float]]]) -> float:
        bounded, raw = check(loser, incumbents, 0).spread, check(loser, incumbents, 0, plain).spread
        assert bounded is not None and raw is not None
        return bounded / raw

    assert ratio(few) > 3 > ratio(many) > 1  # 2 vs 11 degrees of freedom at the first check
    with pytest.raises(ValueError, match="prune policy: spread_upper"):
        PrunePolicy(spread_upper=1.0)
