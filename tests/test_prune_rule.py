"""agent.rules.prune: a run is stopped early only when the keep rule's test, taken on its loss over
a part of the budget, says it is clearly worse; the spread pools the earlier incumbents."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest
from scipy import stats
from scipy.interpolate import PchipInterpolator

from agent.rules.prune import (
    GRID,
    PrunePolicy,
    check,
    loss_at,
    loss_over,
    matched,
    next_check,
    upto,
)

LEVEL = 0.001  # a bar for the tests (agent.rules.decide.stop_level: 1 %/12 ≈ 8.3e-4)


def curve(offset: float = 0.0, seed: int = 0, noise: float = 0.01,
          n: int = 50) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    shift = rng.gauss(0, 0.05)  # a seed's own level, along the whole curve
    return [(i / n, 2.0 + 3.0 * math.exp(-5 * i / n) + shift + offset + rng.gauss(0, noise))
            for i in range(1, n + 1)]


INCUMBENTS = [curve(seed=s) for s in range(5)]
NEW = [curve(offset=-0.3, seed=s) for s in (11, 12)]  # a kept change's 2 runs, 0.3 better
EARLIER = [INCUMBENTS]  # the incumbent before it


def test_a_clearly_losing_run_is_stopped_with_a_reason_a_person_can_read() -> None:
    call = check(curve(offset=1.0, seed=9), INCUMBENTS, 1, LEVEL)
    assert call.stop and call.fraction == 0.5
    assert call.p_worse is not None and call.p_worse <= LEVEL
    text = call.reason()
    assert text.startswith("stopped at 50 % of the budget: loss ")
    assert "over 25–50 % vs the incumbent's" in text and " ± " in text and text.endswith(" there")
    first = check(curve(offset=1.0, seed=9), INCUMBENTS, 0, LEVEL).reason()
    assert first.startswith("stopped at 25 % of the budget: loss ")
    assert " over 0–25 % vs the incumbent's" in first  # the first part: from the run's start


def _part_mean(c: list[tuple[float, float]], start: float, end: float) -> float:
    """A curve's median over (start, end] at every 1/GRID of the budget on the monotone cubic
    through its points (scipy's PCHIP, not the rule's), from its first point on."""
    grid = np.arange(round(start * GRID) + 1, round(end * GRID) + 1) / GRID
    grid = grid[grid >= c[0][0] - 1e-9]
    return float(np.median(PchipInterpolator(*zip(*c, strict=True))(grid)))


def test_a_curve_is_read_between_its_lines_on_the_monotone_cubic_scipy_draws() -> None:
    rng = random.Random(3)
    for k in range(100):
        xs = sorted(x / 200 for x in rng.sample(range(1, 200), rng.randint(2, 12)))
        ys = [3 + math.exp(-5 * x) + rng.gauss(0, 0.05) * (k % 3) for x in xs]
        grid = [i / 200 for i in range(201)]
        ref = PchipInterpolator(xs, ys, extrapolate=False)(grid)
        for got, want, f in zip(loss_at(list(zip(xs, ys, strict=True)), grid), ref, grid,
                                strict=True):
            if got is None:
                assert math.isnan(want) and not xs[0] <= f <= xs[-1]
            else:
                assert got == pytest.approx(float(want), abs=1e-12)


def test_the_test_is_the_keep_rules_t_on_the_curves_spread() -> None:
    """t = (reference − loss) / (s·√(1 + 1/n)), each curve's loss its median over the part since
    the check before at every 1/GRID of the budget, s pooled over the curves, P(T ≤ t) on their
    degrees of freedom."""
    loser = curve(offset=0.1, seed=9)
    call = check(loser, INCUMBENTS, 1, 0.5)
    here = [_part_mean(c, 0.25, 0.5) for c in INCUMBENTS]  # the part since the check before
    ref = sum(here) / 5
    s = stats.tstd(here)
    t = (ref - _part_mean(loser, 0.25, 0.5)) / (s * math.sqrt(1 + 1 / 5))
    assert call.reference == pytest.approx(ref) and call.p_worse == pytest.approx(
        stats.t.cdf(t, 4))
    assert call.loss == pytest.approx(_part_mean(loser, 0.25, 0.5))


@pytest.mark.parametrize("offset", [0.0, 0.05, -0.5])
def test_null_small_or_better_runs_go_on(offset: float) -> None:
    for index in range(3):
        call = check(curve(offset=offset, seed=7), INCUMBENTS, index, LEVEL)
        assert not call.stop, call.reason()


def test_it_is_not_judged_without_a_spread_or_points() -> None:
    loser = curve(offset=1.0, seed=9)
    one = check(loser, INCUMBENTS[:1], 0, LEVEL)
    assert not one.stop and "no spread" in one.why
    same = [curve(seed=1, noise=0.0)] * 3  # a script that ignores its seed: no spread
    assert not check(loser, same, 0, LEVEL).stop
    short = check([(0.05, 9.0)], INCUMBENTS, 1, LEVEL)  # no line in (25 %, 50 %]
    assert not short.stop and "no progress line since the check before" in short.why
    assert "not judged at 50 % of the budget" in short.reason()


def test_exempt_categories_and_a_departed_speed_are_not_judged() -> None:
    loser = curve(offset=2.0, seed=9)
    assert not check(loser, INCUMBENTS, 0, LEVEL, category="data/schedule").stop
    assert not check(loser, INCUMBENTS, 0, LEVEL, category="optimizer").stop  # by default
    assert check(loser, INCUMBENTS, 0, LEVEL, PrunePolicy(exempt=frozenset()),
                 category="optimizer").stop
    assert check(loser, INCUMBENTS, 0, LEVEL, category="architecture").stop
    slow = check(loser, INCUMBENTS, 0, LEVEL, speed_off=True)
    assert not slow.stop and "its loss curve measures the machine" in slow.why


def test_a_new_incumbent_with_two_runs_judges_with_the_earlier_incumbents_spread() -> None:
    loser = curve(offset=0.7, seed=9)  # behind the new incumbent by 1.0
    call = check(loser, NEW, 0, LEVEL, earlier=EARLIER)
    assert call.stop, call.reason()
    here = [_part_mean(c, 0.0, 0.25) for c in NEW]
    assert call.reference == pytest.approx(sum(here) / 2)  # its own level, not the earlier's
    level = check(curve(offset=-0.3, seed=7), NEW, 1, LEVEL, earlier=EARLIER)
    assert level.loss is not None and not level.stop
    # each commit centred on its own mean: the same seeds 10 higher give the same spread
    far = [[(f, v + 10.0) for f, v in c] for c in INCUMBENTS]
    near, away = (check(curve(seed=7), NEW, 1, LEVEL, earlier=[g]) for g in (INCUMBENTS, far))
    assert near.se == pytest.approx(away.se)
    alone = check(loser, NEW, 0, LEVEL)
    assert alone.se != call.se  # the new incumbent's two curves alone


def test_the_spread_pools_every_earlier_incumbent_as_the_keep_rules_noise_pools_the_night() -> None:
    """Not the latest few: the fifth incumbent back counts as the first does (one σ a night)."""
    groups = [[curve(seed=10 * g + s, noise=0.01 * (g + 1)) for s in range(3)] for g in range(5)]
    every = check(curve(seed=99), NEW, 1, LEVEL, earlier=groups)
    latest = check(curve(seed=99), NEW, 1, LEVEL, earlier=groups[:3])
    assert every.se is not None and latest.se is not None and every.se != latest.se


def test_the_checks_cut_the_budget_into_the_keep_rules_looks() -> None:
    """No number of its own: max_runs = K parts, judged at the end of each but the last, each
    on the points since the check before (a point on a check belongs to the part it ends)."""
    assert PrunePolicy().checks == (0.25, 0.5, 0.75)  # max_runs 4, the default
    assert PrunePolicy(looks=2).checks == (0.5,)
    assert PrunePolicy(looks=5).checks == (0.2, 0.4, 0.6, 0.8)
    policy = PrunePolicy()
    assert [policy.part(i) for i in range(3)] == [(-math.inf, 0.25), (0.25, 0.5), (0.5, 0.75)]
    c = [(0.0, 9.0), (0.1, 5.0), (0.25, 7.0), (0.26, 4.0), (0.4, float("nan")), (0.5, 3.0),
         (0.51, 1.0)]
    assert loss_over(c, policy.part(0)) == 7.0  # 9, 5, 7: from the run's start
    assert loss_over(c, policy.part(1)) == 3.5  # 4 and 3; the nan left out
    assert loss_over(c, (0.51, 0.75)) is None


def test_next_check() -> None:
    policy = PrunePolicy()
    assert next_check(0.2, 0, policy) is None
    assert next_check(0.25, 0, policy) == 0
    assert next_check(0.55, 0, policy) == 1  # two passed at once: the latest
    assert next_check(0.55, 2, policy) is None
    assert next_check(1.0, 3, policy) is None


@pytest.mark.parametrize("kwargs", [dict(looks=1), dict(looks=True), dict(looks=2.5)])
def test_a_bad_policy_is_refused_by_name(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="prune policy"):
        PrunePolicy(**kwargs)  # type: ignore[arg-type]


def _worse_by(spreads: float, incumbents: list[list[tuple[float, float]]],
              index: int = 0) -> tuple[list[tuple[float, float]], float]:
    """A run `spreads` times the incumbents' spread over the part behind their mean there (an
    incumbent's curve moved), and that spread."""
    here = matched(incumbents[0], incumbents, PrunePolicy().part(index)).incumbents
    spread = stats.tstd(here)
    move = sum(here) / len(here) - here[0] + spreads * spread
    return [(f, v + move) for f, v in incumbents[0]], spread


@pytest.mark.parametrize("draw", range(20))
def test_a_run_ten_spreads_worse_from_the_start_is_stopped_at_the_first_check(draw: int) -> None:
    """At the engine's bar (the default rule's, K = 4) and the default baseline's 5 curves (4
    degrees of freedom), 10 spreads worse is t = 10/√1.2 = 9.1, past t₄'s 7.5 at 1 %/12: stopped
    at 25 %, the first check. At the earlier bar α(1/K) ≈ 6e-7 (t₄ 47) it went on."""
    from agent.rules.decide import Rule, stop_level

    incumbents = [curve(seed=100 * draw + s) for s in range(5)]
    run, spread = _worse_by(10.0, incumbents)
    call = check(run, incumbents, 0, stop_level(Rule()))
    assert call.stop and call.fraction == 0.25, call.reason()
    assert call.loss is not None and call.reference is not None
    assert call.loss - call.reference == pytest.approx(10 * spread)
    assert call.p_worse is not None and call.p_worse > 6e-7  # the earlier bar kept it running


def test_the_futility_error_holds_for_a_run_no_worse_than_the_incumbent() -> None:
    """The guarantee by construction: a run exchangeable with the incumbent's (no worse) is
    stopped at a check with probability at most its level (here a large one, to count it)."""
    rng = random.Random(5)
    level, stopped, draws = 0.05, 0, 4000
    for _ in range(draws):
        offsets = [rng.gauss(0, 1) for _ in range(6)]
        curves = [[(f / 4, 3.0 + o) for f in range(1, 5)] for o in offsets]
        stopped += check(curves[0], curves[1:], 0, level).stop
    assert abs(stopped / draws - level) < 4 * math.sqrt(level * (1 - level) / draws)


def lined(seed: int, offset: float = 0.0) -> list[tuple[float, float]]:
    """A steep curve (a real first quarter: the loss falls by half) logged as a real script
    logs it, a line every few seconds: each run's lines at its own steps (a spacing of 4–10 %
    of the budget, a random phase), after a first line at step 1 of 48."""
    rng = random.Random(seed)
    shift, every = rng.gauss(0, 0.01), rng.uniform(0.04, 0.10)
    fractions = [1 / 48, *(rng.uniform(0, every) + k * every for k in range(int(1 / every) + 2))]
    return [(f, 2.0 + 3.5 * math.exp(-8 * f) + shift + offset + rng.gauss(0, 0.002))
            for f in sorted({min(f, 1.0) for f in fractions})]


def test_runs_logged_at_other_steps_are_read_at_the_same_points() -> None:
    """On a curve that halves over the first quarter, the median of each run's own lines there
    moves with its lines' steps (a spread of 0.32 over five runs), and a run 0.5 behind from
    the start went on; read at the same points (a spread of 0.02) it stops at the first check."""
    from agent.rules.decide import Rule, stop_level

    incumbents = [lined(s) for s in range(5)]
    medians = [loss_over(c, PrunePolicy().part(0)) for c in incumbents]
    same = matched(incumbents[0], incumbents, PrunePolicy().part(0)).incumbents
    assert stats.tstd(medians) > 10 * stats.tstd(same)
    for draw in range(10):
        call = check(lined(100 + draw, offset=0.5), incumbents, 0, stop_level(Rule()))
        assert call.stop and call.fraction == 0.25, call.reason()


def test_the_futility_error_holds_for_runs_logged_at_other_steps() -> None:
    """Exchangeable runs (the same curve, each seed's lines at its own steps) stop at a check
    with probability at most its level: the matched points read every run alike."""
    level, stopped, draws = 0.05, 0, 1500
    for d in range(draws):
        curves = [lined(10 * d + s) for s in range(6)]
        stopped += check(curves[0], curves[1:], d % 3, level).stop
    assert stopped / draws <= level + 4 * math.sqrt(level * (1 - level) / draws)


def test_a_run_behind_from_its_start_but_catching_up_goes_on() -> None:
    """A lower learning rate on the real gpt target (benchmarks/crossing.py): 55 spreads behind
    at 5 % of the budget, 14 at 25 %, level by 60 %. Behind at the first check, but its gap
    fell by far more than the check's standard error within the part read: it goes on. A run
    whose gap grows (a learning rate too low to learn) and one a constant 10 spreads behind
    are stopped there as before."""
    from agent.rules.decide import Rule, stop_level

    level = stop_level(Rule())
    incumbents = [curve(seed=s) for s in range(5)]
    spread = 0.05

    def behind(gap) -> list[tuple[float, float]]:
        return [(f, v + gap(f) * spread) for f, v in curve(seed=77)]

    closing = check(behind(lambda f: 60 * max(0.0, 1 - f / 0.6) ** 2), incumbents, 0, level)
    assert not closing.stop and closing.p_worse is not None and closing.p_worse <= level
    assert closing.why.startswith("behind but catching up: ")
    assert "went on at 25 % of the budget" in closing.reason()
    growing = check(behind(lambda f: 100 * f), incumbents, 0, level)
    assert growing.stop, growing.reason()
    constant = check(behind(lambda f: 10.0), incumbents, 0, level)
    assert constant.stop, constant.reason()


def test_every_curve_is_read_only_as_far_as_the_judged_run_has_got() -> None:
    """A trainer whose loss is the same function of its step in every run (a test's fake, a
    script that ignores the seed), a line every 10 steps of 40, on a busy machine: the judged
    run has reached step 20 at 60 % of the budget. Read to their ends, the incumbent's curves
    bend at step 20 with a neighbour on either side and the run's with one: 0.415 against
    0.393, 260 times a spread of 8e-5, and it was stopped (tests/test_runs.py's null sweep
    beside a hog). Read as far as the run has got, they are the same curve."""
    per_budget = 33.3

    def at(steps: tuple[int, ...], wobble: float = 0.0) -> list[tuple[float, float]]:
        return [(s / per_budget, 5.0 / s + wobble) for s in steps]

    incumbents = [at((10, 20, 30, 40), 1e-4 * k) for k in range(5)]
    run = at((10, 20), 2e-4)
    m = matched(run, incumbents, PrunePolicy().part(1))
    assert m.loss == pytest.approx(statistics.fmean(m.incumbents), abs=1e-9)
    call = check(run, incumbents, 1, LEVEL)
    assert not call.stop and call.p_worse is not None and call.p_worse > 0.4, call.reason()
    assert upto(incumbents[0], run[-1][0]) == incumbents[0][:2]
    assert upto(at((15, 25, 35)), 20 / per_budget) == at((15, 25))  # its first line past it
