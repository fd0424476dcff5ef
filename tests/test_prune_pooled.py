"""agent.rules.prune: the spread pools the sweep's earlier incumbents' curves, so a new
incumbent with its 2 runs judges its first challengers; the reference level stays its own."""

from __future__ import annotations

import math

import pytest
from test_prune_rule import INCUMBENTS, curve

from agent.rules.prune import PrunePolicy, check, futile, late_crossing, loss_at

NEW = [curve(offset=-0.3, seed=s) for s in (11, 12)]  # the kept change's 2 runs, 0.3 better
EARLIER = [INCUMBENTS]  # the incumbent before it: 3 curves at its own level


def test_a_new_incumbent_with_two_runs_judges_with_the_earlier_incumbents_spread() -> None:
    loser = curve(offset=0.7, seed=9)  # behind the new incumbent by 1.0
    alone = check(loser, NEW, 0)
    assert not alone.stop and "needed to calibrate" in alone.why
    call = check(loser, NEW, 0, earlier=EARLIER)
    assert call.stop, call.reason()
    here = [loss_at(c, 0.3, 0.05) or math.nan for c in NEW]
    assert call.reference == pytest.approx(sum(here) / 2)  # its own level, not the earlier's
    assert call.margin is not None and call.spread is not None
    assert call.margin == pytest.approx(max(5.0 * call.spread * math.sqrt(1 + 1 / 2),
                                            0.01 * abs(call.reference)))


def test_a_run_level_with_the_new_incumbent_goes_on() -> None:
    # level with the new incumbent is 0.3 ahead of the earlier one: never judged by its level
    for index in range(3):
        call = check(curve(offset=-0.3, seed=7), NEW, index, earlier=EARLIER)
        assert call.loss is not None and not call.stop, call.reason()


def test_each_commit_is_centred_on_its_own_mean() -> None:
    far = [[(f, v + 10.0) for f, v in c] for c in INCUMBENTS]  # the same seeds, 10 higher
    near, away = (check(curve(seed=7), NEW, 1, earlier=[g]) for g in (INCUMBENTS, far))
    assert near.spread == pytest.approx(away.spread)
    # one curve of an earlier commit adds no degree of freedom
    assert "needed to calibrate" in check(curve(seed=7), NEW, 0, earlier=[INCUMBENTS[:1]]).why


def test_the_spread_tightens_with_the_earlier_curves_and_pool_earlier_bounds_them() -> None:
    own = check(curve(seed=7), INCUMBENTS, 1)
    pooled = check(curve(seed=7), INCUMBENTS, 1, earlier=[NEW, INCUMBENTS])
    assert own.spread is not None and pooled.spread is not None
    assert pooled.spread < own.spread  # more degrees of freedom: a lower upper bound
    off = check(curve(seed=7), INCUMBENTS, 1, PrunePolicy(pool_earlier=0), earlier=[NEW])
    assert off.spread == own.spread
    loser = curve(offset=0.7, seed=9)
    assert not check(loser, NEW, 0, PrunePolicy(pool_earlier=0), earlier=EARLIER).stop
    assert not check(loser, NEW[:1], 0, earlier=EARLIER).stop  # one curve: no reference level


def test_futility_pools_the_same_spread() -> None:
    policy = PrunePolicy(futile_z=(0.5, 0.5, 0.5))
    behind = curve(offset=-0.15, seed=9)  # behind the new incumbent by 0.15: within the margin
    assert "needed to calibrate" in futile(behind, NEW, 1, policy).why
    call = futile(behind, NEW, 1, policy, earlier=EARLIER)
    assert call.stop and call.futile, call.reason()
    assert not check(behind, NEW, 1, policy, earlier=EARLIER).stop


def test_a_negative_pool_earlier_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="pool_earlier"):
        PrunePolicy(pool_earlier=-1)


def test_late_crossing_names_the_check_a_completed_winner_looked_behind_at() -> None:
    # behind by 2.0 until 40 % of the budget, then ahead: a schedule knob's shape
    crossing = [(f, v + (2.0 if f <= 0.4 else -0.2)) for f, v in curve(seed=7)]
    policy = PrunePolicy()
    call = late_crossing(crossing, INCUMBENTS, policy, ended_better=True)
    assert call is not None and call.stop and call.fraction == 0.3
    # judged as if not exempt: its category's exemption is what it would learn
    assert not check(crossing, INCUMBENTS, 0, policy, category="data/schedule").stop
    assert late_crossing(crossing, INCUMBENTS, policy, ended_better=False) is None
    level = curve(offset=-0.2, seed=7)  # ahead all along: nothing crossed
    assert late_crossing(level, INCUMBENTS, policy, ended_better=True) is None
    assert late_crossing(crossing, NEW, policy, ended_better=True) is None  # 2 curves alone
    assert late_crossing(crossing, NEW, policy, ended_better=True, earlier=EARLIER) is not None
