"""The keep rule as a table: every branch of decide(), both directions, runs in other machine
conditions (blocking in time), identical repeats, stale head."""

from __future__ import annotations

import math

import pytest

from agent.core.domain import CrashKind, Direction
from agent.core.domain import ExperimentStatus as S
from agent.rules.classify import CrashFacts
from agent.rules.decide import (
    Evidence,
    Rule,
    RunFailure,
    Sample,
    contract_warnings,
    decide,
    incumbent_due,
)
from agent.rules.noise import pooled_sigma, speed_noise, speed_tolerance, squares, z_score

SEQ = Rule()  # defaults: sequential, discard z < 0.6, keep z >= 1.75 from run 2, 4 runs max
MAX = Rule(direction=Direction.MAXIMIZE)
STRICT = Rule(decision="strict")
BASE = (Sample(1.0), Sample(1.1), Sample(0.9))  # mean 1.0, sd 0.1, 2 degrees of freedom
SAME = (Sample(1.0), Sample(1.0), Sample(1.0))  # identical repeats: no degrees of freedom


def ev(runs, best=BASE, **kw):
    return Evidence(False, tuple(Sample(v) if isinstance(v, float) else v for v in runs),
                    best, **kw)


def crash(**kw):
    facts = dict(timed_out=False, fail_marker=False, exit_code=1, signal=None, error=None,
                 log_tail="", training_started=False, has_metric=False)
    facts.update(kw)
    return CrashFacts(**facts)


@pytest.mark.parametrize(
    "name, evidence, rule, status, seed, keep",
    [
        # sequential, minimize: σ̂ = 0.1 (baseline), n_best = 3
        ("clearly worse: discard at once", ev([1.2]), SEQ, S.DISCARDED, None, False),
        ("equal: discard at once", ev([1.0]), SEQ, S.DISCARDED, None, False),
        ("promising once: run again, seed base+1", ev([0.85]), SEQ, None, 43, False),
        ("one great run is never a keep", ev([0.5]), SEQ, None, 43, False),
        ("two good runs: keep", ev([0.8, 0.82]), SEQ, S.KEPT, None, True),
        ("second run regresses: discard", ev([0.88, 1.05]), SEQ, S.DISCARDED, None, False),
        ("undecided after two: third run", ev([0.88, 0.95]), SEQ, None, 44, False),
        ("undecided after four: discard", ev([0.9, 0.95, 0.9, 0.95]), SEQ, S.DISCARDED, None,
         False),
        ("min_delta eats the gain", ev([0.8, 0.82]), Rule(min_delta=0.15), S.DISCARDED, None,
         False),
        ("noise_sigma stands in for σ̂", ev([0.8, 0.82], best=SAME),
         Rule(noise_sigma=0.05), S.KEPT, None, True),
        ("identical repeats are no σ̂: never kept", ev([0.5, 0.5], best=SAME),
         SEQ, None, 44, False),
        ("no σ̂ after max runs: discard", ev([0.5, 0.6], best=SAME),
         Rule(max_runs=2), S.DISCARDED, None, False),
        ("σ̂ from the change's own runs", ev([0.5, 0.6, 0.5], best=SAME),
         SEQ, S.KEPT, None, True),
        # maximize: the sign flips
        ("maximize: higher is better", ev([1.2, 1.18]), MAX, S.KEPT, None, True),
        ("maximize: lower is worse", ev([0.8]), MAX, S.DISCARDED, None, False),
        # strict (autoresearch's rule)
        ("strict: one better run keeps", ev([0.99]), STRICT, S.KEPT, None, True),
        ("strict: equal discards", ev([1.0]), STRICT, S.DISCARDED, None, False),
        ("strict + confirm: run again", ev([0.9]), Rule(decision="strict", confirm_runs=2),
         None, 43, False),
        ("strict + confirm: mean decides", ev([0.9, 1.1, 1.1]),
         Rule(decision="strict", confirm_runs=2), S.DISCARDED, None, False),
    ],
)
def test_decision_table(name, evidence, rule, status, seed, keep):
    v = decide(evidence, rule)
    assert (v.status, v.seed, v.keep) == (status, seed, keep), (name, v.reason)
    if status is not None:
        assert v.reason


def test_keep_states_the_evidence():
    v = decide(ev([0.8, 0.82]), SEQ)
    assert v.metric == pytest.approx(0.81) and v.n == 2 and v.sigma == pytest.approx(
        pooled_sigma([[1.0, 1.1, 0.9], [0.8, 0.82]])[0])
    assert v.p_better > 0.99 and "P(better)" in v.reason and "σ̂" in v.reason


def test_baseline_runs_three_times_then_keeps_the_mean():
    runs = (Sample(1.0), Sample(1.2))
    assert decide(Evidence(True, runs), SEQ).seed == 44
    v = decide(Evidence(True, runs + (Sample(1.1),)), SEQ)
    assert v.status is S.KEPT and v.keep and v.metric == pytest.approx(1.1)
    assert decide(Evidence(True, (Sample(1.0),)), STRICT).status is S.KEPT  # strict: one run
    # a busy machine: each run in its own condition; after the cap the mean of all, with a
    # warning
    swings = tuple(Sample(1.0 + i / 10, t) for i, t in enumerate((100.0, 300.0, 20.0)))
    v = decide(Evidence(True, swings), SEQ)
    assert v.suspect == (False, True, True) and v.seed == 45  # run k uses seed + k
    assert "another machine condition" in v.notes[1]
    # two of three at one speed: the mean of those two, the third said to be the machine
    two = tuple(Sample(m, t) for m, t in ((1.0, 100.0), (1.2, 101.0), (0.6, 160.0)))
    v = decide(Evidence(True, two), SEQ)
    assert v.status is S.KEPT and v.metric == pytest.approx(1.1) and v.suspect[2]
    v = decide(Evidence(True, swings + (Sample(1.3, 1000.0),)), SEQ)
    assert v.status is S.KEPT and v.metric == pytest.approx(1.15) and v.n == 4
    assert "busy" in v.reason


def test_stale_head_is_requeued_before_spending_more_runs():
    v = decide(ev([0.85], head_moved=True), SEQ)  # would run again: re-queue instead
    assert v.status is S.DISCARDED and v.requeue and "re-queued" in v.reason
    v = decide(ev([0.8, 0.82], head_moved=True), SEQ)  # would keep: re-queue instead
    assert v.status is S.DISCARDED and v.requeue and not v.keep
    v = decide(ev([0.8, 0.82], head_moved=True, conflict="patch failed"), SEQ)
    assert v.status is S.DISCARDED and not v.requeue and "conflicts" in v.reason
    assert decide(ev([1.2], head_moved=True), SEQ).requeue is False  # worse: just discarded
    assert decide(ev([0.9], head_moved=True), STRICT).requeue  # strict would keep


INC = tuple(Sample(m, 100.0, run_id=i + 1, seed=7 + i) for i, m in enumerate((1.0, 1.1, 0.9)))


def run(metric, speed, run_id, seed=42, pair_of=None):
    return Sample(metric, speed, run_id=run_id, seed=seed, pair_of=pair_of)


def test_a_run_off_the_incumbents_speed_gets_the_incumbent_beside_it():
    v = decide(ev([run(0.5, 140.0, 10)], best=INC), SEQ)  # 40 % faster: machine or change?
    assert v.status is None and v.incumbent and (v.pair_of, v.seed) == (10, 42)
    assert v.suspect == (True,) and "+40%" in v.notes[0] and "beside it" in v.reason
    # the incumbent beside it was as fast: the machine; one run there is a weak reference
    best = INC + (run(0.52, 141.0, 11, pair_of=10),)
    v = decide(ev([run(0.5, 140.0, 10)], best=best), SEQ)
    assert v.incumbent and (v.pair_of, v.seed) == (10, 43) and v.best_suspect[-1]
    # away from its usual conditions a decision rests on three incumbent runs (fresh ones)
    best += (run(0.49, 139.0, 12, seed=43, pair_of=10),)
    v = decide(ev([run(0.5, 140.0, 10)], best=best), SEQ)
    assert v.incumbent and (v.pair_of, v.seed) == (10, 44) and "weak reference" in v.reason
    # three: decided there, not against the slow ones
    best += (run(0.51, 141.0, 13, seed=44, pair_of=10),)
    v = decide(ev([run(0.5, 140.0, 10)], best=best), SEQ)
    assert v.status is S.DISCARDED and v.suspect == (True,) and v.n == 1
    assert "beside incumbent runs 11, 12, 13" in v.reason and "the machine" in v.notes[0]


def test_a_faster_run_that_is_worse_is_discarded_without_an_incumbent_run():
    """On a time budget a faster machine trains more steps, never fewer: a first run 40 %
    faster than the incumbent's latest runs and worse than them is worse still beside it."""
    v = decide(ev([run(1.2, 140.0, 10)], best=INC), SEQ)
    assert v.status is S.DISCARDED and not v.incumbent and not v.requeue
    assert v.reason.startswith("not better") and "a faster machine does not make a run worse" \
        in v.reason and "+40%" in v.reason
    assert v.z == pytest.approx(-0.2 / (0.1 * math.sqrt(1 + 1 / 3))) and v.metric == 1.2
    assert v.suspect == (True,) and "in the incumbent's usual terms" in v.reason
    assert "+40%" in v.notes[0] and "without an incumbent run beside it" in v.notes[0]
    # compared with a busier condition than the usual one: its metric in the usual terms
    busy = INC + tuple(Sample(m, 70.0, run_id=4 + i, seed=10 + i, pair_of=3)
                       for i, m in enumerate((2.0, 2.1)))
    w = decide(ev([run(2.3, 100.0, 10)], best=busy), SEQ)
    assert w.status is S.DISCARDED and "+43%" in w.reason
    assert w.metric == pytest.approx(1.0 + 0.25)  # 0.25 worse than the busy runs, from 1.0
    assert decide(ev([run(1.2, 140.0, 10)], best=INC, head_moved=True), SEQ).requeue is False
    # slower and worse: the machine or the change? the incumbent runs beside it, as before
    slow = decide(ev([run(1.2, 60.0, 10)], best=INC), SEQ)
    assert slow.incumbent and slow.status is None
    # faster and no worse (z 0 at the incumbent's mean): compared beside the incumbent
    level = decide(ev([run(1.0, 140.0, 10)], best=INC), SEQ)
    assert level.incumbent and level.status is None
    # maximize: a lower metric is the worse one
    up = decide(ev([run(0.8, 140.0, 10)], best=INC), MAX)
    assert up.status is S.DISCARDED and "faster machine" in up.reason
    assert decide(ev([run(1.2, 140.0, 10)], best=INC), MAX).incumbent


def test_a_changed_speed_counts_as_the_changes_own_when_the_incumbent_kept_its_speed():
    best = INC + (run(1.05, 101.0, 11, pair_of=10),)
    v = decide(ev([run(0.8, 60.0, 10)], best=best), SEQ)
    assert v.status is None and not v.incumbent and v.seed == 43 and v.suspect == (False,)
    assert "the change's own" in v.notes[0]
    # its next run agrees with its speed: same conditions, no incumbent run needed; kept
    v = decide(ev([run(0.8, 60.0, 10), run(0.82, 61.0, 12, seed=43)], best=best), SEQ)
    assert v.status is S.KEPT and v.suspect == (False, False)


def test_a_run_whose_speed_moved_from_the_run_before_is_not_decided_on():
    runs = [run(0.8, 100.0, 10), run(0.5, 150.0, 11, seed=43)]
    v = decide(ev(runs, best=INC), SEQ)
    assert v.incumbent and v.pair_of == 11 and v.seed == 43 and "the machine moved" in v.notes[1]
    # the machine never holds still: discarded at the cap
    swings = [run(0.5, t, 10 + i, seed=42 + i) for i, t in enumerate((150, 60, 200, 30, 250))]
    v = decide(ev(swings, best=INC), SEQ)
    assert v.status is S.DISCARDED and "kept changing" in v.reason
    assert v.metric == pytest.approx(0.5)  # no comparison: the plain mean of its runs
    alone = decide(ev([0.4, 0.6], best=()), SEQ)  # no incumbent runs at all: the same
    assert alone.status is S.DISCARDED and "no incumbent runs" in alone.reason
    assert alone.metric == pytest.approx(0.5)


def test_a_run_back_at_the_incumbents_latest_speed_is_compared_there():
    """Its first run met a busy machine (the incumbent beside it as slow), the machine was
    quiet again for the incumbent's next runs: its second run, off its first one's speed but
    at the incumbent's latest, is placed there, not sent for yet another incumbent run."""
    best = INC + (run(1.3, 81.0, 11, pair_of=10), run(1.0, 100.0, 12, seed=43, pair_of=10),
                  run(1.05, 99.0, 13, seed=44, pair_of=10))
    v = decide(ev([run(1.1, 80.0, 10), run(0.9, 100.0, 14, seed=43)], best=best), SEQ)
    assert "the machine moved; back at the usual speed" in v.notes[1]
    # compared in both conditions: what it waits for is a second incumbent run in the busy one
    assert v.suspect == (True, False) and v.incumbent and "weak reference" in v.reason
    was = decide(ev([run(1.1, 80.0, 10), run(0.9, 100.0, 14, seed=43)], best=best[:4]), SEQ)
    # with the incumbent's latest run still busy it has no comparison: the incumbent runs
    assert was.pair_of == 14 and "the machine moved; the incumbent runs beside it" in was.reason


def test_a_speed_confirmed_as_the_changes_own_needs_no_second_confirmation():
    """Its runs beside the incumbent at the incumbent's usual speed, its own speed confirmed
    by its second run: a third run at that speed is the change's own at once (no wait)."""
    best = INC + (run(1.05, 101.0, 11, pair_of=10), run(1.0, 100.0, 13, seed=43, pair_of=12),
                  run(1.02, 99.0, 15, seed=44, pair_of=14))
    runs = [run(0.8, 60.0, 10), run(0.82, 61.0, 12, seed=43), run(0.79, 60.5, 14, seed=44)]
    v = decide(ev(runs, best=best), SEQ)
    assert "whose speed was confirmed" in v.notes[1] and "whose speed was confirmed" in v.notes[2]
    assert v.status is S.KEPT and v.suspect == (False, False, False)


def test_a_gain_taken_at_the_incumbents_speed_says_so():
    """Within one condition the metric clearly follows the speed (a time budget): the gain is
    taken at the incumbent's speed, so the recorded metric is not its runs' mean, and the
    reason says that it is in the incumbent's terms and why."""
    wide = Rule(throughput_tolerance=0.5)

    def at(speed, off, run_id, seed=42):  # metric = 1 − 0.5·ln(speed/100), + off
        return run(1.0 - 0.5 * math.log(speed / 100.0) + off, speed, run_id, seed)

    best = (at(100.0, 0.0, 1, 7), at(110.0, 0.001, 2, 8), at(90.0, -0.001, 3, 9))
    v = decide(ev([at(120.0, -0.3, 10), at(125.0, -0.299, 11, 43)], best=best), wide)
    raw = (at(120.0, -0.3, 10).metric + at(125.0, -0.299, 11).metric) / 2
    assert v.status is S.KEPT and abs(v.metric - raw) > 0.05
    assert v.metric == pytest.approx(1.0 - 0.2995, abs=2e-3)
    assert "the metric follows the machine's speed" in v.reason
    assert "in the incumbent's usual terms" in v.reason
    plain = decide(ev([0.8, 0.82]), SEQ)  # no speeds: no slope, nothing said
    assert "speed" not in plain.reason


def test_a_keep_rests_on_three_incumbent_runs_in_its_conditions():
    best = (Sample(1.0, run_id=1, seed=42), Sample(1.1, run_id=2, seed=43))
    v = decide(ev([Sample(0.5, run_id=3), Sample(0.52, run_id=4, seed=43)], best=best),
               Rule(noise_sigma=0.1))
    # beside its latest run, with a seed the incumbent has not run
    assert v.incumbent and v.pair_of == 4 and v.seed == 44 and "would be kept" in v.reason


def test_identical_repeats_say_so_when_nothing_is_kept():
    v = decide(ev([0.5, 0.5, 0.5, 0.5], best=SAME), SEQ)
    assert v.status is S.DISCARDED and "OVERNIGHT_SEED" in v.reason


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
    assert "run 2 (seed 43) failed: boom" in v.reason


def test_noise_helpers():
    assert pooled_sigma([[1.0], [2.0]]) == (None, 0)
    sigma, df = pooled_sigma([[1.0, 3.0]], prior=squares([[0.0, 2.0, 4.0]]))
    assert df == 3 and sigma == pytest.approx(math.sqrt(10 / 3))
    assert z_score(0.0, 0.0, 1, 3) == 0.0 and z_score(0.1, 0.0, 1, 3) == math.inf
    assert z_score(-0.1, 0.0, 1, 3) == -math.inf
    assert pooled_sigma([[1.0, 1.0], [2.0, 2.0, 2.0]]) == (None, 0)  # identical: no evidence
    # back-to-back runs of one commit on one device measure the speed's noise
    rows = [("a", None, 100.0), ("a", None, 102.0), ("b", None, 50.0), ("b", None, 49.0),
            ("c", "cuda:1", 10.0), ("c", "cuda:0", 20.0)]
    noise = speed_noise(rows)
    assert noise is not None and 0.01 < noise < 0.03
    assert speed_noise(rows[:2]) is None and speed_tolerance(None) == 0.1
    assert speed_tolerance(0.0) == 0.05 and speed_tolerance(1.0) == 0.3


def test_incumbent_rerun_cadence():
    assert [incumbent_due(k, 0, SEQ) for k in (0, 7, 8)] == [False, False, True]
    assert not incumbent_due(8, 1, SEQ) and incumbent_due(16, 1, SEQ)
    assert not incumbent_due(100, 0, STRICT) and not incumbent_due(100, 0, Rule(incumbent_every=0))


def test_a_change_kept_on_its_own_two_runs_gets_a_fresh_incumbent_run_next():
    """Its 2 runs are the ones that won it the keep (the winner's curse): before the next
    proposal the new incumbent runs once more, whatever the periodic schedule says."""
    assert incumbent_due(1, 0, SEQ, best_runs=2) and incumbent_due(1, 5, SEQ, best_runs=1)
    assert not incumbent_due(1, 0, SEQ, best_runs=3)  # the fresh run done (or the baseline's 3)
    assert not incumbent_due(1, 0, SEQ, best_runs=0)  # no runs: nothing to re-run
    assert incumbent_due(8, 0, SEQ, best_runs=5)  # the periodic one still comes
    assert not incumbent_due(1, 0, STRICT, best_runs=2)
    assert not incumbent_due(1, 0, Rule(incumbent_every=0), best_runs=2)


def test_contract_warnings():
    assert contract_warnings({"training_seconds": 300.0}, 300) == []
    assert "over" in contract_warnings({"training_seconds": 330.0}, 300)[0]
    assert "OVERNIGHT_BUDGET_S" in contract_warnings({"training_seconds": 20.0}, 300)[0]
    assert "no training_seconds" in contract_warnings({"val_bpb": 1.0}, 300)[0]
    assert contract_warnings({}, 300) == []
