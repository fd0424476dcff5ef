"""agent.rules.prune: a run is stopped early only when its curve is clearly behind."""

from __future__ import annotations

import math
import random

import pytest

from agent.rules.prune import PrunePolicy, check, loss_at, next_check


def curve(offset: float = 0.0, seed: int = 0, noise: float = 0.01,
          n: int = 50) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    shift = rng.gauss(0, 0.05)  # a seed's own level, along the whole curve
    return [(i / n, 2.0 + 3.0 * math.exp(-5 * i / n) + shift + offset + rng.gauss(0, noise))
            for i in range(1, n + 1)]


INCUMBENTS = [curve(seed=s) for s in range(3)]


def test_a_clearly_losing_run_is_stopped_with_a_reason_a_person_can_read() -> None:
    call = check(curve(offset=1.0, seed=9), INCUMBENTS, 1)
    assert call.stop and call.fraction == 0.5
    assert call.loss is not None and call.reference is not None and call.margin is not None
    assert call.loss - call.reference > call.margin
    text = call.reason()
    assert text.startswith("stopped at 50 % of the budget: loss ")
    assert "vs the incumbent's" in text and " ± " in text and text.endswith("at the same point")


@pytest.mark.parametrize("offset", [0.0, 0.05, -0.5])
def test_null_small_or_better_runs_go_on(offset: float) -> None:
    for index in range(3):
        call = check(curve(offset=offset, seed=7), INCUMBENTS, index)
        assert not call.stop, call.reason()


def test_the_margin_is_stricter_early() -> None:
    policy = PrunePolicy()
    early, late = (check(curve(seed=5), INCUMBENTS, i, policy) for i in (0, 2))
    assert early.margin is not None and late.margin is not None and early.spread and late.spread
    assert early.margin / early.spread > late.margin / late.spread


def test_it_is_not_judged_without_enough_incumbent_curves_or_points() -> None:
    loser = curve(offset=1.0, seed=9)
    one = check(loser, INCUMBENTS[:1], 0)
    assert not one.stop and "needed to calibrate" in one.why
    short = check([(0.05, 9.0)], INCUMBENTS, 0)
    assert not short.stop and "no progress line" in short.why
    assert "not judged at 30 % of the budget" in short.reason()


def test_exempt_categories_and_a_departed_speed_are_not_judged() -> None:
    # at 30 % three curves give 2 degrees of freedom: the spread's upper bound is ~5× it
    loser = curve(offset=2.0, seed=9)
    assert not check(loser, INCUMBENTS, 0, category="data/schedule").stop
    assert check(loser, INCUMBENTS, 0, category="architecture").stop
    slow = check(loser, INCUMBENTS, 0, speed_ratio=0.7)
    assert not slow.stop and "measures the machine" in slow.why
    assert check(loser, INCUMBENTS, 0, speed_ratio=0.95).stop


def test_identical_incumbent_curves_fall_back_to_the_relative_floor() -> None:
    same = [curve(seed=1, noise=0.0)] * 3  # a script that ignores its seed
    assert not check([(f, v * 1.005) for f, v in same[0]], same, 0).stop
    assert check([(f, v * 1.05) for f, v in same[0]], same, 0).stop


def test_loss_at_and_next_check() -> None:
    c = [(0.1, 5.0), (0.26, 4.0), (0.28, float("nan")), (0.3, 3.0), (0.31, 1.0)]
    assert loss_at(c, 0.3, 0.05) == 3.5
    assert loss_at(c, 0.2, 0.05) is None
    policy = PrunePolicy()
    assert next_check(0.2, 0, policy) is None
    assert next_check(0.3, 0, policy) == 0
    assert next_check(0.55, 0, policy) == 1  # two passed at once: the latest
    assert next_check(0.55, 2, policy) is None
    assert next_check(1.0, 3, policy) is None


@pytest.mark.parametrize("kwargs", [dict(checks=(0.5, 0.3), z=(4.0, 4.0)), dict(z=(4.0,)),
                                    dict(checks=(0.0,), z=(4.0,)), dict(min_curves=1)])
def test_a_bad_policy_is_refused_by_name(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="prune policy"):
        PrunePolicy(**kwargs)  # type: ignore[arg-type]
