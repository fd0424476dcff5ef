"""The keep rule as a table (docs/keep-rule.md): its four outcomes, the test's looks and level,
identical repeats, blocks by machine condition, the stale head, failures."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from agent.analysis.evidence import t_quantile
from agent.core.domain import CrashKind, Direction
from agent.core.domain import ExperimentStatus as S
from agent.core.record import Ending
from agent.rules import fdr
from agent.rules.classify import CrashFacts
from agent.rules.contract import contract_warnings
from agent.rules.decide import (
    FUTILITY_ERROR,
    NOT_BETTER,
    Evidence,
    Rule,
    RunFailure,
    Sample,
    decide,
    incumbent_due,
    look_share,
    next_seed,
    stop_level,
)
from agent.rules.noise import pooled_of, speed_noise, speed_tolerance, squared_deviations, t_sf
from agent.rules.placement import conditions, place

SEQ = Rule()  # defaults: fdr 0.2, discard below 0.5·k, 4 looks, 5 baseline runs
MAX = Rule(direction=Direction.MAXIMIZE)
STRICT = Rule(decision="strict")
BASE = tuple(Sample(m) for m in (1.0, 1.1, 0.9, 1.05, 0.95))  # mean 1.0, 4 degrees of freedom
SAME = (Sample(1.0), Sample(1.0))  # identical repeats: the noise cannot be measured


def ev(runs, best=BASE, **kw):
    """A change's runs (floats: run k with seed 42 + k) against `best`."""
    return Evidence(False, tuple(Sample(v, seed=42 + i) if isinstance(v, float) else v
                                 for i, v in enumerate(runs)), best, **kw)


def crash(**kw):
    facts = dict(timed_out=False, fail_marker=False, exit_code=1, signal=None, error=None,
                 log_tail="", training_started=False, has_metric=False)
    facts.update(kw)
    return CrashFacts(**facts)


@pytest.mark.parametrize(
    "name, evidence, rule, status, seed, keep",
    [
        ("clearly worse: discard at once", ev([1.2]), SEQ, S.DISCARDED, None, False),
        ("equal: discard at once", ev([1.0]), SEQ, S.DISCARDED, None, False),
        ("one great run is never a keep: run again, seed base+1", ev([0.3]), SEQ, None, 43,
         False),
        ("two great runs: keep", ev([0.3, 0.31]), SEQ, S.KEPT, None, True),
        ("a second run that regresses: discard (t below 2 × 0.5)", ev([0.85, 1.05]), SEQ,
         S.DISCARDED, None, False),
        ("better, not yet clear: a third run", ev([0.9, 0.88]), SEQ, None, 44, False),
        ("not clear after max_runs: discard", ev([0.9, 0.88, 0.9, 0.89]), SEQ, S.DISCARDED,
         None, False),
        ("min_delta eats the gain", ev([0.3, 0.31]), Rule(min_delta=0.8), S.DISCARDED, None,
         False),
        ("maximize: higher is better", ev([1.7, 1.69]), MAX, S.KEPT, None, True),
        ("maximize: lower is worse", ev([0.8]), MAX, S.DISCARDED, None, False),
        # no σ̂ (a script that ignores its seed): the single comparison, one run
        ("identical repeats: better on one run is kept", ev([0.97], best=SAME), SEQ, S.KEPT,
         None, True),
        ("identical repeats: equal is not", ev([1.0], best=SAME), SEQ, S.DISCARDED, None, False),
        ("identical repeats: min_delta still counts", ev([0.97], best=SAME),
         Rule(min_delta=0.05), S.DISCARDED, None, False),
        # strict (autoresearch's rule)
        ("strict: one better run keeps", ev([0.99]), STRICT, S.KEPT, None, True),
        ("strict: equal discards", ev([1.0]), STRICT, S.DISCARDED, None, False),
        ("strict + confirm: run again", ev([0.9]), Rule(decision="strict", confirm_runs=2),
         None, 43, False),
        ("strict + confirm: the mean decides", ev([0.9, 1.1, 1.1]),
         Rule(decision="strict", confirm_runs=2), S.DISCARDED, None, False),
    ],
)
def test_decision_table(name, evidence, rule, status, seed, keep):
    v = decide(evidence, rule)
    assert (v.status, v.seed, v.keep) == (status, seed, keep), (name, v.reason)
    if status is not None:
        assert v.reason


def test_a_keep_states_its_test_and_the_numbers_are_the_models():
    """t = gain / (σ̂·√(1/n + 1/m)) on the pooled σ̂'s degrees of freedom; kept when
    P(T ≥ t) ≤ α_t · look_share(k); P(better) is P(T ≤ t) (Student's t, not Φ)."""
    v = decide(ev([0.3, 0.31]), SEQ)
    sigma, df = pooled_of([squared_deviations([[b.metric for b in BASE], [0.3, 0.31]])])
    se = sigma * math.sqrt(1 / 2 + 1 / 5)
    t = (1.0 - 0.305) / se
    assert (v.sigma, v.df, v.n) == (pytest.approx(sigma), df, 2) and df == 5
    assert v.p_better == pytest.approx(stats.t.cdf(t, df))
    assert v.level == pytest.approx(fdr.level((), 0.2))  # the night's level α_t
    spent = look_share(2, 4, v.level)
    assert v.p_value == pytest.approx(stats.t.sf(t, df) / spent)  # kept: p ≤ α_t
    assert v.p_value <= v.level
    assert v.metric == pytest.approx(0.305)  # the best (1.0) less the gain
    # the reason prints the record's pair: one p, one level
    assert v.reason.startswith("better") and f"σ̂ {sigma:.3g}" in v.reason
    assert f"p {v.p_value:.2g}, level {v.level:.2g}" in v.reason


def obrien_fleming(s: float, alpha: float) -> float:
    """Lan and DeMets's O'Brien–Fleming-type spending function, by scipy."""
    return 2 * stats.norm.sf(stats.norm.isf(alpha / 2) / math.sqrt(s))


@pytest.mark.parametrize("alpha", [0.0125, 1e-3, 1e-6])
@pytest.mark.parametrize("looks", [2, 3, 4, 6])
def test_the_levels_spent_by_look_are_obrien_flemings_and_none_on_the_first(alpha, looks):
    """Look k of K spends α(k/K) − α((k−1)/K) of the level (its share of the change's runs as
    the information); look 1 keeps nothing and leaves its α(1/K) to look 2; 1 in all."""
    assert look_share(1, looks, alpha) == 0.0
    assert sum(look_share(k, looks, alpha) for k in range(1, looks + 1)) == pytest.approx(1.0)
    for k in range(2, looks + 1):
        before = obrien_fleming((k - 1) / looks, alpha) if k > 2 else 0.0
        want = (obrien_fleming(k / looks, alpha) - before) / alpha
        assert look_share(k, looks, alpha) == pytest.approx(want, rel=1e-4, abs=1e-12)
    assert look_share(looks + 1, looks, alpha) == look_share(looks, looks, alpha)  # past K: look K


def test_a_smaller_level_spends_less_early():
    assert look_share(2, 4, 1e-4) < look_share(2, 4, 1e-2) < look_share(2, 4, 0.1)
    assert [round(look_share(k, 4, 0.0125), 4) for k in range(2, 5)] == [0.033, 0.2811, 0.686]


def test_the_early_stop_spends_its_futility_error_evenly_over_every_check():
    """β = 1 % over a change's K runs × (K − 1) checks: each check's level is β / (K(K − 1)),
    whatever the night's tests (non-binding: the keep's α is not touched)."""
    assert FUTILITY_ERROR == 0.01
    assert stop_level(SEQ) == pytest.approx(0.01 / 12)
    assert stop_level(Rule(max_runs=2)) == pytest.approx(0.01 / 2)
    assert stop_level(Rule(max_runs=5)) * 5 * 4 == pytest.approx(FUTILITY_ERROR)


def test_the_night_level_is_addis():
    """Tian and Ramdas's ADDIS with τ = 0.5, λ = 0.25, w0 = τλα, γ_j = 1/(j(j + 1)):
    discarded tests (p > τ) cost nothing, candidates (p ≤ τλ) do not age the level, and a
    keep raises it."""
    a = 0.2
    first = fdr.level((), a)
    assert first == pytest.approx(0.5 * 0.25 * a / 2)
    assert fdr.level(((0.9, False), (1.0, False)), a) == first  # discarded
    assert fdr.level(((0.1, False),), a) == first  # a candidate
    aged = fdr.level(((0.3, False),), a)
    assert aged == pytest.approx(0.5 * 0.25 * a / 6)
    after = fdr.level(((0.001, True),), a)  # a keep is a candidate too: nothing aged
    assert after == pytest.approx(0.5 * 0.75 * a / 2)
    assert after > first and fdr.level(((0.001, True),) * 40, a) <= 0.5 * 0.25


def test_the_baseline_runs_its_runs_and_says_when_they_are_identical():
    runs = tuple(Sample(1.0 + i / 10, seed=42 + i) for i in range(4))
    assert decide(Evidence(True, runs), SEQ).seed == 46  # the next seed none of its runs used
    v = decide(Evidence(True, (*runs, Sample(1.4, seed=46))), SEQ)
    assert v.status is S.KEPT and v.keep and v.metric == pytest.approx(1.2)
    assert decide(Evidence(True, SAME), SEQ).status is None  # identical so far: all five run
    same = tuple(Sample(1.0, seed=42 + i) for i in range(5))
    v = decide(Evidence(True, same), SEQ)
    assert v.status is S.KEPT and "identical" in v.reason
    assert decide(Evidence(True, (Sample(1.0),)), STRICT).status is S.KEPT  # strict: one run
    # runs at another speed: the mean of the usual condition (the most runs)
    mixed = tuple(Sample(m, t) for m, t in ((1.0, 100.0), (1.2, 101.0), (1.1, 99.0),
                                             (0.6, 160.0), (0.5, 161.0)))
    v = decide(Evidence(True, mixed), SEQ)
    assert v.status is S.KEPT and v.metric == pytest.approx(1.1) and v.suspect[3:] == (
        True, True) and "another" in v.reason


def test_the_deterministic_night_says_the_noise_was_not_measured():
    v = decide(ev([0.97], best=SAME), SEQ)
    assert "not measured" in v.reason and "OVERNIGHT_SEED" in v.reason and v.p_value is None
    assert decide(ev([1.01], best=SAME), SEQ).reason.startswith("not better")


def test_a_stale_head_is_requeued_before_more_runs():
    v = decide(ev([0.9], head_moved=True), SEQ)  # would run again: re-queue instead
    assert v.status is S.DISCARDED and v.requeue and "re-queued" in v.reason
    v = decide(ev([0.3, 0.31], head_moved=True), SEQ)  # would keep: re-queue instead
    assert v.status is S.DISCARDED and v.requeue and not v.keep
    v = decide(ev([0.3, 0.31], head_moved=True, conflict="patch failed"), SEQ)
    assert v.status is S.DISCARDED and not v.requeue and "conflicts" in v.reason
    assert decide(ev([1.2], head_moved=True), SEQ).requeue is False  # worse: just discarded
    assert decide(ev([0.9], head_moved=True), STRICT).requeue  # strict would keep


INC = tuple(Sample(m, 100.0, run_id=i + 1, seed=42 + i)
            for i, m in enumerate((1.0, 1.1, 0.9, 1.05, 0.95)))


def run(metric, speed, run_id, seed=50, pair_of=None):
    return Sample(metric, speed, run_id=run_id, seed=seed, pair_of=pair_of)


def timed(runs, best):
    """ev() on a machine whose speed's run-to-run noise is measured (1 %: a 4 % tolerance)."""
    return ev(runs, best=best, speed_noise=0.01)


COMPUTE = Rule(time_budget=False)  # a compute budget: "600 steps"


def test_a_compute_budget_puts_runs_at_any_speed_in_one_condition():
    """On a compute budget every run trains the same steps, so its speed says nothing of its
    metric (docs/keep-rule.md#the-model): the incumbent's runs at 100 and 30 tokens/s are one
    condition, a change run at 45 is compared at once (no incumbent run beside it), and a clear
    gain is kept; on a time budget the same runs are split and the change waits for a pair."""
    inc = (*INC[:3], run(1.05, 30.0, 4, seed=45), run(0.95, 31.0, 5, seed=46))
    change = [run(0.31, 45.0, 10, seed=42), run(0.3, 80.0, 12, seed=43)]
    v = decide(timed(change, inc), COMPUTE)
    assert v.status is S.KEPT and v.ending is Ending.KEPT and not v.set_aside
    assert "the incumbent's 5 runs (mean 1.000000)" in v.reason  # no speed named: none matters
    assert v.compared_with is not None and v.compared_with.n == 5 and len(v.blocks) == 1
    assert v.best is not None and v.best.n == 5 and not any(v.suspect)
    assert len(set(conditions(inc, COMPUTE.tolerance(0.01)))) == 1
    # the same runs on a time budget: two conditions, the first change run is in neither
    assert len(set(conditions(inc, SEQ.tolerance(0.01)))) == 2
    v = decide(timed(change[:1], inc), SEQ)
    assert v.incumbent and v.pair_of == 10 and v.set_aside == (10,)
    # the baseline's own runs at two speeds: all of them make its value on a compute budget
    base = decide(Evidence(True, inc, speed_noise=0.01), COMPUTE)
    assert base.ending is Ending.BASELINE and base.change.n == 5 and not base.set_aside
    assert decide(Evidence(True, inc, speed_noise=0.01), SEQ).change.n == 3


def test_a_run_at_a_speed_the_incumbent_never_ran_gets_the_incumbent_beside_it():
    v = decide(timed([run(0.9, 70.0, 10)], INC), SEQ)
    assert v.status is None and v.incumbent and v.pair_of == 10 and v.seed == 50
    assert "a speed the incumbent has not run at" in v.reason
    # the incumbent already ran seed 50: the smallest seed it has not run
    v = decide(ev([run(0.9, 70.0, 10)], best=INC, speed_noise=0.01,
                  started_seeds=frozenset({50})), SEQ)
    assert v.incumbent and v.seed == 47


def test_a_pair_is_one_condition_and_a_speed_ratio_is_trusted_once_two_pairs_agree():
    beside = (*INC, run(1.3, 71.0, 11, pair_of=10))  # the machine slowed: both ran slow
    v = decide(timed([run(1.0, 70.0, 10)], beside), SEQ)
    assert v.status is None and not v.incumbent  # compared in the slow condition: run again
    # the change is itself 30 % slower (the incumbent beside kept its speed): its next run
    # gets a pair too, until two pairs agree on the ratio
    own = (*INC, run(1.0, 100.0, 11, pair_of=10))
    v = decide(timed([run(0.6, 70.0, 10), run(0.6, 70.5, 12)], own), SEQ)
    assert v.incumbent and v.pair_of == 12


def test_a_speed_ratio_is_measured_only_beside_incumbent_runs_in_a_known_condition():
    # the load switched between each change run and the incumbent run beside it: both pairs
    # "agree" on a 7x ratio, but the incumbent's slow runs make a condition of their own
    straddled = (*INC, run(3.0, 14.0, 11, pair_of=10), run(3.05, 14.1, 13, pair_of=12))
    v = decide(timed([run(1.0, 100.0, 10), run(1.02, 100.5, 12, seed=51)], straddled), SEQ)
    assert not v.keep and v.status is None


def test_a_change_s_own_speed_ratio_is_confirmed_by_two_agreeing_pairs_not_by_one():
    """The change runs twice as fast as the incumbent beside it, in the condition the
    incumbent's earlier runs (none beside the change) know: two pairs at ×2 confirm the
    ratio, and a run with no pair is then placed by it (199 ÷ 2 is about the usual 100)."""
    tol = speed_tolerance(0.01)
    fast = [run(0.6, 200.0, 10), run(0.62, 201.0, 12, seed=51), run(0.61, 199.0, 14, seed=52)]
    beside = (*INC, run(1.0, 100.0, 11, pair_of=10), run(1.02, 100.5, 13, seed=51, pair_of=12))
    two = place(fast, beside, tol)
    assert two.ratios == pytest.approx((2.0, 2.0)) and two.beside == 2
    assert two.ratio_confirmed and not two.pending
    assert two.keys[2] == two.keys[0] == conditions(INC, tol)[0]
    # one pair at ×2 is not yet the change's ratio: the unpaired run waits for an incumbent
    one = place([fast[0], fast[2]], beside[:6], tol)
    assert one.ratios == pytest.approx((2.0,)) and one.beside == 1
    assert not one.ratio_confirmed and one.pending and one.keys[1] is None


def test_a_speed_ratio_that_holds_while_the_machine_s_speed_moves_between_pairs_counts():
    """The demo beside other jobs: the change trains twice as fast as the incumbent run beside
    it (×2.0, ×2.0, ×1.95) while the machine's speed moved between pairs (the incumbent beside it
    at 30, 90 and 20, none of them a speed its other runs know). The pair cancels the machine,
    so a ratio that holds across machine speeds is the change's own: it is judged, and kept."""
    pairs = [(0.60, 60.0, 1.02, 30.0), (0.62, 180.0, 0.98, 90.0), (0.61, 39.0, 1.01, 20.0),
             (0.59, 100.0, 1.0, 50.0)]
    mine: list[Sample] = []
    inc = INC
    for k, (m, speed, im, ispeed) in enumerate(pairs):
        mine.append(run(m, speed, 10 + 2 * k, seed=42 + k))
        inc = (*inc, run(im, ispeed, 11 + 2 * k, seed=42 + k, pair_of=10 + 2 * k))
        if k == 1:
            two = place(mine, inc, speed_tolerance(0.01))
            assert two.ratios == pytest.approx((2.0, 2.0)) and two.ratio_confirmed
        v = decide(timed(mine, inc), SEQ)
        if v.status is not None:
            break
    assert v.keep and v.ending is Ending.KEPT, v.reason
    assert v.n >= 2 and not v.set_aside


def test_a_change_whose_pairs_never_agree_on_its_speed_is_not_judged_not_called_worse():
    # a demo night beside other jobs: each run of the change won its pair by ~2 units, but the
    # load moved between a run and its pair (ratios 2.4, 1.6, 1.7, 1.3): its value is what its
    # runs measured, never the best less a gain measured elsewhere (1.28 against 3.49)
    pairs = [(4.2, 6308.0, 7.40, 2632.0), (5.83, 3623.0, 7.38, 2273.0),
             (5.10, 4462.0, 7.41, 2632.0), (5.59, 3788.0, 7.39, 2857.0)]
    inc = tuple(run(3.5 + d, 16400.0, i + 1, seed=42 + i)
                for i, d in enumerate((0.002, -0.03, -0.004, 0.015)))
    mine: list[Sample] = []
    for k, (m, speed, im, ispeed) in enumerate(pairs):
        mine.append(run(m, speed, 10 + 2 * k, seed=42 + k))
        inc = (*inc, run(im, ispeed, 11 + 2 * k, seed=47 + k, pair_of=10 + 2 * k))
        v = decide(timed(mine, inc), SEQ)
        assert not v.keep
        if k < 3:
            assert v.status is None and not v.reason.startswith(NOT_BETTER)
    assert v.status is S.DISCARDED and v.ending is Ending.NOT_JUDGED and v.p_value is None
    assert set(v.change.values) <= {m for m, *_ in pairs} and v.n + len(v.set_aside) == 4
    assert v.metric == pytest.approx(sum(v.change.values) / v.n)  # measured, not 1.28
    assert v.reason.startswith("not judged: better beside the incumbent")
    assert "×2.4" in v.reason and "the machine's speed kept changing" in v.reason


def test_fewer_incumbent_runs_than_the_changes_in_a_condition_balance_first():
    slow = (*INC, run(1.3, 71.0, 11, pair_of=10))
    v = decide(timed([run(1.0, 70.0, 10), run(1.0, 70.2, 12)], slow), SEQ)
    assert v.incumbent and v.pair_of == 12 and "the incumbent has fewer runs" in v.reason


@pytest.mark.parametrize(
    "failure, runs, status, kind, repair",
    [
        (RunFailure(stopped=True), [], S.CANCELLED, None, False),
        (RunFailure(tampered=("prepare.py",)), [0.5], S.CRASHED, CrashKind.FUNDAMENTAL, False),
        (RunFailure(facts=crash(error="NameError: name 'x' is not defined")), [], S.CRASHED,
         CrashKind.TRIVIAL, True),
        (RunFailure(facts=crash(fail_marker=True, training_started=True)), [], S.CRASHED,
         CrashKind.FUNDAMENTAL, False),
        (RunFailure(facts=crash(timed_out=True, exit_code=None)), [], S.TIMEOUT,
         CrashKind.TIMEOUT, False),
        (RunFailure(facts=crash(error="MemoryError"), error="MemoryError"), [0.85], S.DISCARDED,
         None, False),  # a later run of a change failed: not kept
    ],
)
def test_failures(failure, runs, status, kind, repair):
    v = decide(ev(runs, failed=failure), SEQ)
    assert (v.status, v.crash_kind, v.repair, v.keep) == (status, kind, repair, False)


def test_a_later_baseline_run_failing_fails_the_baseline():
    v = decide(Evidence(True, (Sample(1.0),), failed=RunFailure(error="boom")), SEQ)
    assert v.status is S.CRASHED and v.crash_kind is CrashKind.FUNDAMENTAL
    assert "its run 2 failed: boom" in v.reason


def test_noise_helpers():
    assert pooled_of([squared_deviations([[1.0], [2.0]])]) == (None, 0)
    sigma, df = pooled_of([squared_deviations([[1.0, 3.0]])],
                          prior=squared_deviations([[0.0, 2.0, 4.0]]))
    assert df == 3 and sigma == pytest.approx(math.sqrt(10 / 3))
    assert pooled_of([squared_deviations([[1.0, 1.0], [2.0, 2.0, 2.0]])]) == (None, 0)  # identical
    for t, df in ((0.3, 1), (-2.0, 3), (4.2, 7), (1.5, 100)):
        assert t_sf(t, df) == pytest.approx(stats.t.sf(t, df), abs=1e-12)
    assert t_sf(1.0, None) == pytest.approx(stats.norm.sf(1.0)) and t_sf(math.inf, 3) == 0
    for p, df in ((0.025, 2), (0.04, 7), (0.3, 30)):
        assert t_quantile(p, df) == pytest.approx(stats.t.isf(p, df), abs=1e-9)
    assert t_quantile(0.025, None) == pytest.approx(stats.norm.isf(0.025))
    rows = [("a", None, 100.0), ("a", None, 102.0), ("b", None, 50.0), ("b", None, 49.0),
            ("c", "cuda:1", 10.0), ("c", "cuda:0", 20.0)]
    noise = speed_noise(rows)
    assert noise is not None and 0.01 < noise < 0.03
    assert speed_noise(rows[:2]) is None and speed_tolerance(None) == 0.3
    assert speed_tolerance(0.0) == 0.05 and speed_tolerance(1.0) == 0.3


def test_incumbent_rerun_cadence():
    assert [incumbent_due(k, 0, SEQ) for k in (0, 7, 8)] == [False, False, True]
    assert not incumbent_due(8, 1, SEQ) and incumbent_due(16, 1, SEQ)
    assert not incumbent_due(100, 0, STRICT) and not incumbent_due(100, 0, Rule(incumbent_every=0))
    assert not incumbent_due(100, 0, SEQ, noise_measured=False)  # repeats say nothing


def test_one_seed_picker():
    assert next_seed(set(), SEQ) == 42 and next_seed({42, 43}, SEQ) == 44
    assert next_seed({42}, SEQ, prefer=50) == 50 and next_seed({50, 42}, SEQ, prefer=50) == 43


def test_contract_warnings():
    assert contract_warnings({"training_seconds": 300.0}, 300) == []
    assert "over" in contract_warnings({"training_seconds": 330.0}, 300)[0]
    # the demo beside a hog: 11 s for 6 s in 2 steps is its last step, not an ignored budget
    (slow,) = contract_warnings({"training_seconds": 11.0, "num_steps": 2}, 6)
    assert slow == ("trained 11 s for a 6 s budget (83% over): its last step ran past it (5.5 s "
                    "a step, and the loop reads the clock between steps), so runs train a whole "
                    "number of steps and one more or less is 92% of the budget")
    assert contract_warnings({"training_seconds": 11.0, "num_steps": 30}, 6)[0].endswith(
        "does the script stop at OVERNIGHT_BUDGET_S?")
    assert "OVERNIGHT_BUDGET_S" in contract_warnings({"training_seconds": 20.0}, 300)[0]
    assert "no training_seconds" in contract_warnings({"val_bpb": 1.0}, 300)[0]
    assert contract_warnings({}, 300) == []


def test_contract_warnings_on_a_compute_budget():
    """Steps or tokens trained against the compute budget; the seconds they took are the
    machine's, never a warning."""
    from agent.core.budget import ComputeBudget

    steps, tokens = ComputeBudget(600, "steps"), ComputeBudget(2_000_000, "tokens")
    assert contract_warnings({"training_seconds": 9000.0, "num_steps": 600}, 300, steps) == []
    assert contract_warnings({"training_seconds": 1.0, "num_steps": 600}, 300, steps) == []
    assert contract_warnings({"training_seconds": 30.0, "num_steps": 412}, 300, steps) == [
        "trained 412 steps of a 600 steps budget: runs are not comparable; does the script read "
        "OVERNIGHT_BUDGET_STEPS?"]
    # tokens: within one step of the budget (whole steps of 4,096 tokens)
    near = {"training_seconds": 30.0, "num_steps": 489, "total_tokens_M": 2.003}
    assert contract_warnings(near, 300, tokens) == []
    far = {"training_seconds": 30.0, "num_steps": 100, "total_tokens_M": 0.41}
    assert "OVERNIGHT_BUDGET_TOKENS" in contract_warnings(far, 300, tokens)[0]
