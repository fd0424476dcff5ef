"""The sweep page's fold (api/dashboard/fold.py) on a real SQLite file: after every finish of
every status the folded rollup, plot, evidence and digest equal what the whole-sweep functions
compute from the same rows; finishes (keeps included) are folded in, in id order (one that
finishes above a still-open row waits until that one finishes), while a flipped verdict makes
a new fold from the whole sweep."""

from __future__ import annotations

import random
import statistics
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from dashboard_oracles import insights_panel, progress_svg, rollup_of
from test_store_contract import CONFIG, spec

import agent.analysis.evidence as evidence_module
import agent.engine.gather as gather_module
import agent.rules.run_records as run_records_module
from agent.analysis.evidence import sweep_evidence
from agent.analysis.folds import Ordered
from agent.analysis.insights_fold import digest
from agent.analysis.trials import gain_scale
from agent.core.domain import (
    CrashKind,
    ExperimentStatus,
    Finish,
    Proposal,
    RunEnd,
    RunRole,
    RunSpec,
    RunStatus,
    utcnow,
)
from agent.engine.gather import gather, noise_parts
from agent.rules.endings import finish_of, refused
from agent.rules.noise import pooled_of, speed_noise
from api.dashboard import views
from api.dashboard.fold import SweepFold, advance
from api.dashboard.history import HistoryCache
from db.engine import open_database
from db.reads import Reads
from db.store import SqlStore

S = ExperimentStatus
KNOBS = ("LR", "WIDTH", "DEPTH", "DROPOUT")


class Sweep:
    """A sweep in a real SQLite file, its experiments finished one by one through the store."""

    def __init__(self, path: Path) -> None:
        self.store = SqlStore(open_database(path / "fold.db"))
        self.reads = Reads(self.store)
        self.sid = self.store.create_sweep(replace(spec(), config=CONFIG)).id
        self.rng, self.n, self.best = random.Random(7), 0, "c0"
        self.history = HistoryCache()
        self.fold: SweepFold | None = None

    def start(self, baseline: bool = False, pure: bool = True) -> int:
        self.n += 1
        knob = KNOBS[self.n % len(KNOBS)]
        diff = (f"--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-{knob} = 1\n"
                f"+{knob} = {self.n + 1}\n") if pure else \
            f"--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = f(1)\n+x = g({self.n})\n"
        e = self.store.add_experiment(self.sid, Proposal(f"change {self.n}", diff),
                                      is_baseline=baseline)
        self.store.claim(e.id)
        self.store.mark_started(e.id, commit=f"c{e.id}", base_commit=self.best,
                                run_started_at=utcnow() - timedelta(seconds=30))
        return e.id

    def run(self, eid: int, commit: str, metric: float | None,
            role: RunRole = RunRole.SCREEN, started: int | None = None) -> int:
        """A run of `commit` that ended with `metric` (`started`: a run started before)."""
        if started is None:
            started = self.store.start_run(RunSpec(self.sid, eid, commit, 42, role)).id
        ok = RunStatus.OK if metric is not None else RunStatus.FAILED
        self.store.end_run(started, RunEnd(ok, metric=metric, training_s=1.0))
        return started

    def finish(self, eid: int, status: ExperimentStatus, metric: float | None = None,
               kind: CrashKind | None = None, reason: str | None = None,
               run: int | None = None) -> None:
        self.run(eid, f"c{eid}", metric if status is not S.TIMEOUT else None, started=run)
        keep = f"c{eid}" if status is S.KEPT else None
        self.store.finish(eid, Finish(status, kind, reason, metric, best_before=1.0,
                                      run_started_at=utcnow() - timedelta(seconds=20),
                                      run_ended_at=utcnow(), best=metric if keep else None),
                          keep_commit=keep)
        if keep:
            self.best = keep

    def step(self) -> SweepFold:
        """The fold moved on to the store's rows, checked against the whole-sweep functions."""
        sweep = self.store.get_sweep_by_id(self.sid)
        h = self.history.get(self.reads, self.sid, self.reads.sweep_version(self.sid))
        self.fold = fold = advance(self.fold, sweep, h)
        ev = fold.sweep_evidence(sweep)
        plot = views.draw_progress(fold.plot(), sweep.metric,
                                   evidence=ev)  # works out the drawn runs' evidence
        assert fold.insights(sweep) == digest(sweep, h.experiments)
        whole_ev = sweep_evidence(sweep, h.experiments, h.runs)
        assert ev == whole_ev and dict(ev.experiments) == dict(whole_ev.experiments)
        assert plot == progress_svg(h.experiments, sweep.metric, evidence=whole_ev)
        assert fold.rollup_now() == rollup_of(h.experiments, running_time=False)
        return fold


@pytest.fixture
def sweep(tmp_path: Path) -> Sweep:
    s = Sweep(tmp_path)
    base = s.start(baseline=True)
    s.run(base, f"c{base}", 1.0, RunRole.BASELINE)
    s.finish(base, S.KEPT, 1.0)
    s.step()
    return s


def _ordinary(s: Sweep, i: int) -> None:
    """One finish of a kind that folds in: discarded, crashed, timeout, rejected..."""
    eid = s.start(pure=i % 3 != 0)
    roll = i % 6
    if roll == 0:
        s.finish(eid, S.CRASHED, kind=CrashKind.FUNDAMENTAL, reason="CUDA out of memory")
    elif roll == 1:
        s.finish(eid, S.TIMEOUT, kind=CrashKind.TIMEOUT, reason="over budget")
    elif roll == 2:
        s.store.finish(eid, Finish(S.INTERRUPTED, reason="stopped"))
    else:
        s.finish(eid, S.DISCARDED, 1.0 + s.rng.gauss(0.01, 0.02))


def test_finishes_fold_in_and_equal_the_whole_sweep(sweep: Sweep) -> None:
    queued = sweep.store.add_experiment(sweep.sid, Proposal("waiting", "--- a/q\n+++ b/q\n"))
    for i in range(40):
        _ordinary(sweep, i)
        fold = sweep.step()
        assert fold.folds == i + 1  # folded in, not rebuilt
    rejected = sweep.store.add_experiment(sweep.sid, Proposal("bad", "x"),
                                          ended=finish_of(refused("does not apply")))
    assert sweep.step().folds == 41 and rejected.id > queued.id
    assert sweep.step().exps.pending  # finished above a queued row: drawn, not folded yet
    sweep.store.finish(queued.id, Finish(S.CANCELLED, reason="cancelled"))  # the old open row
    fold = sweep.step()
    assert fold.folds == 43 and not fold.exps.pending and not fold.exps.open_ids


def test_keeps_and_late_finishes_fold_in_and_a_flipped_verdict_rebuilds(sweep: Sweep) -> None:
    for i in range(12):
        _ordinary(sweep, i)
        sweep.step()
    kept = sweep.start()
    sweep.finish(kept, S.KEPT, 0.95)  # the best moves: drawn with the new best, folded in
    assert sweep.step().folds == 13
    for i in range(3):  # built on the new best: their P(better) reads its runs
        sweep.finish(sweep.start(), S.DISCARDED, 0.96 + i / 100)
        sweep.step()
    incumbent = sweep.run(kept, f"c{kept}", 0.96, RunRole.INCUMBENT)  # a re-measure folds in
    assert sweep.step().folds == 17
    sweep.store.set_run_status(incumbent, RunStatus.SUSPECT)  # ok → suspect: read again
    assert sweep.step().folds == 0
    for i in range(4):  # two slots: the later experiment (and run) ends first
        first, second = sweep.start(pure=i % 2 == 0), sweep.start()
        runs = [sweep.store.start_run(RunSpec(sweep.sid, e, f"c{e}", 42, RunRole.SCREEN)).id
                for e in (first, second)]
        sweep.finish(second, S.DISCARDED, 1.02 - i / 100, run=runs[1])
        fold = sweep.step()
        assert fold.exps.pending and fold.runs.pending
        sweep.finish(first, [S.DISCARDED, S.CRASHED][i % 2], 0.99 + i / 100,
                     *([CrashKind.FUNDAMENTAL, "CUDA out of memory"] if i % 2 else []),
                     run=runs[0])
        fold = sweep.step()
        assert fold.folds == 2 * i + 2 and not fold.exps.pending and not fold.runs.pending
    again = sweep.start()
    sweep.finish(again, S.KEPT, 0.9)  # another keep, after the late ones
    assert sweep.step().folds == 9
    for i in range(6):
        _ordinary(sweep, i)
        assert sweep.step().folds == 10 + i


def test_the_page_after_a_finish_shows_the_folded_summary(sweep: Sweep) -> None:
    for i in range(8):
        _ordinary(sweep, i)
    store, swept = sweep.store, sweep.store.get_sweep_by_id(sweep.sid)
    first = views.sweep_summary(sweep.reads, swept)
    _ordinary(sweep, 9)
    after = views.sweep_summary(sweep.reads, store.get_sweep_by_id(sweep.sid))
    marks = sweep.reads.experiment_marks(sweep.sid, with_diffs=True)
    assert after is not first and after.rollup.counts == rollup_of(marks).counts
    assert after.insights == insights_panel(swept, marks)
    assert after.evidence == sweep_evidence(swept, marks, store.run_metrics(sweep.sid))


def _scale_by_sorting(gains: list[float]) -> float | None:
    """The noise scale as it was computed before (statistics over every deviation)."""
    if len(gains) < 4:
        return None
    mid = statistics.median(gains)
    deviations = [abs(g - mid) for g in gains]
    return max(1.4826 * statistics.median(deviations) or statistics.mean(deviations), 1e-12)


def test_the_scale_of_sorted_gains_is_the_scale_by_sorting() -> None:
    rng = random.Random(5)
    for trial in range(3000):
        n = rng.randint(0, 30)
        draw = [lambda: rng.gauss(0, 1), lambda: rng.choice([0.0, 0.1, -0.1, 0.2]),
                lambda: round(rng.uniform(-1, 1), 2), lambda: 1.0][trial % 4]
        gains = [draw() for _ in range(n)]
        want = _scale_by_sorting(gains)
        assert gain_scale(gains) == want and gain_scale(sorted(gains), ordered=True) == want


def test_a_fold_is_left_as_it_was_when_the_next_one_is_made(sweep: Sweep) -> None:
    for i in range(70):  # more than Ordered inserts one by one: a rebuild sorts them in
        _ordinary(sweep, i)
    sweep.fold = None  # the next step folds the whole sweep
    before = sweep.step()
    assert before.folds == 0
    swept = sweep.store.get_sweep_by_id(sweep.sid)
    seen = (before.insights(swept), before.sweep_evidence(swept), before.rollup_now(),
            views.draw_progress(before.plot(), swept.metric))
    for i in range(8):  # knobs, areas, crashes, commits and stretches added to in the copies
        _ordinary(sweep, i)
        sweep.step()
    assert seen == (before.insights(swept), before.sweep_evidence(swept), before.rollup_now(),
                    views.draw_progress(before.plot(), swept.metric))


def test_an_ordered_list_takes_values_in_any_order() -> None:
    rng = random.Random(3)
    values = Ordered()
    for n in (200, 3, 0, 70, 1):
        for _ in range(n):
            values.add(rng.random())
        copy = values.copy()
        copy.add(2.0)
        assert values.values() == sorted(values.values()) and 2.0 not in values.values()
        assert copy.values()[-1] == 2.0 and len(copy) == len(values) + 1


def test_a_kept_commit_re_run_as_the_incumbent_shows_all_its_runs(sweep: Sweep) -> None:
    """The baseline re-run beside a change: its row says "+1 re-run" and shows the mean of all
    its runs, the value the recorded best and the later changes' deltas are measured with."""
    from rich.console import Console

    from overnight.console import results_table

    base = sweep.store.list_experiments(sweep.sid)[0]
    sweep.run(base.id, base.commit or "", 1.2, RunRole.INCUMBENT)
    eid = sweep.start()
    sweep.finish(eid, S.DISCARDED, 1.05)
    sweep.step()  # the fold, moved on by the re-run, equals the whole-sweep evidence
    s = sweep.store.get_sweep_by_id(sweep.sid)
    ev = sweep_evidence(s, sweep.store.list_experiments(sweep.sid),
                        sweep.store.list_runs(sweep_id=sweep.sid))
    mine = ev.experiments[base.id]
    assert (mine.n, mine.reruns) == (2, 1) and mine.commit_mean == pytest.approx(3.2 / 3)
    assert ev.experiments[eid].reruns == 0 and ev.experiments[eid].commit_mean is None
    out = Console(width=250, record=True)
    out.print(results_table(s, sweep.store.list_experiments(sweep.sid), evidence=ev))
    row = next(line for line in out.export_text().splitlines() if "baseline" in line or
               f"│ {base.id} " in line)
    assert "1.066667" in row and "2 +1 re-run" in row, row


def test_identical_repeats_measure_no_sigma_on_any_screen(sweep: Sweep) -> None:
    """A script that ignores its seed repeats its metric to the digit: the keep rule leaves those
    runs out of σ̂ (agent.rules.noise.squared_deviations), and so does the evidence every screen
    reads,
    which would otherwise say "σ̂ 0 (2 df)" beside keeps "on one run: the noise was not
    measured". Runs that differ measure it, in the fold and in the whole-sweep evidence alike."""
    base = sweep.store.list_experiments(sweep.sid)[0]
    for _ in range(2):
        sweep.run(base.id, base.commit or "", 1.0, RunRole.INCUMBENT)
    ev = sweep.step().sweep_evidence(sweep.store.get_sweep_by_id(sweep.sid))
    assert (ev.sigma, ev.df) == (None, 0)
    assert ev.experiments[base.id].ci is None  # not "± 0": identical repeats measure no width
    sweep.run(base.id, base.commit or "", 1.3, RunRole.INCUMBENT)
    ev = sweep.step().sweep_evidence(sweep.store.get_sweep_by_id(sweep.sid))
    assert ev.df == 4 and ev.sigma == pytest.approx((0.072 / 4) ** 0.5)  # 1.0 ×4 and 1.3


def test_the_headers_sigma_is_the_keep_rules_per_machine_condition(sweep: Sweep) -> None:
    """σ̂ on every screen is the keep rule's (agent.engine.gather.night_noise): each commit's
    good runs per machine condition. Runs the machine slowed (suspect: another condition) add
    their own spread: not left out, which put the header on fewer degrees of freedom than the
    decision before it (demo beside a hog: 0.848 on 4 df, the discard's reason 0.788 on 5), and
    not pooled with the fast runs, which would count the machine as noise."""
    base = sweep.store.list_experiments(sweep.sid)[0]
    for metric, speed, status in ((1.2, 100.0, RunStatus.OK), (1.1, 100.0, RunStatus.OK),
                                  (2.0, 50.0, RunStatus.SUSPECT), (2.2, 50.0, RunStatus.SUSPECT)):
        rid = sweep.store.start_run(RunSpec(sweep.sid, base.id, base.commit or "", 42,
                                            RunRole.INCUMBENT)).id
        sweep.store.end_run(rid, RunEnd(status, metric=metric, throughput=speed,
                                        throughput_unit="steps/s", training_s=1.0))
    ev = sweep.step().sweep_evidence(sweep.store.get_sweep_by_id(sweep.sid))
    # 1.0 twice (the baseline's runs, speed unknown), 1.2 and 1.1 at 100 steps/s: squares
    # 0.0275 on 3 df; 2.0 and 2.2 at 50 steps/s: 0.02 on 1
    assert ev.df == 4 and ev.sigma == pytest.approx((0.0475 / 4) ** 0.5)
    ss, df = noise_parts(sweep.store.run_metrics(sweep.sid))
    assert (ev.sigma, ev.df) == pooled_of([(ss, df)])


def test_a_decision_measures_the_sweeps_speed_noise_once(sweep: Sweep,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule's tolerance and σ̂'s come from one measurement of the sweep's speed noise (it
    was measured twice per decision: once for the rule, once inside noise_parts)."""
    base = sweep.store.list_experiments(sweep.sid)[0]
    for metric, speed in ((1.2, 100.0), (1.1, 101.0), (2.0, 50.0), (2.2, 51.0)):
        rid = sweep.store.start_run(RunSpec(sweep.sid, base.id, base.commit or "", 42,
                                            RunRole.INCUMBENT)).id
        sweep.store.end_run(rid, RunEnd(RunStatus.OK, metric=metric, throughput=speed,
                                        throughput_unit="steps/s", training_s=1.0))
    calls: list[int] = []

    def counted(rows):  # type: ignore[no-untyped-def]
        calls.append(len(rows))
        return speed_noise(rows)

    monkeypatch.setattr(gather_module, "speed_noise", counted)
    monkeypatch.setattr(run_records_module, "speed_noise", counted)
    head = base.commit or ""
    got = gather(sweep.store, sweep.sid, base, head, "a change")
    assert len(calls) == 1
    assert got.others == noise_parts(sweep.store.run_metrics(sweep.sid), (head, "a change"))


def test_a_kept_value_that_is_not_its_value_now_says_so_without_a_re_run(sweep: Sweep) -> None:
    """A change kept on runs compared across machine conditions: its value then (the best less
    its gain) is not its value now (its own runs in its usual condition), re-run or not. Every
    screen says both (demo beside a hog: kept at 5.447475; the summary's best 5.031793)."""
    eid = sweep.start()
    sweep.run(eid, f"c{eid}", 0.9)
    sweep.finish(eid, S.KEPT, 0.95)  # its keep-time value; its runs are 0.9 and 0.95
    sweep.step()
    s = sweep.store.get_sweep_by_id(sweep.sid)
    ev = sweep_evidence(s, sweep.store.list_experiments(sweep.sid),
                        sweep.store.list_runs(sweep_id=sweep.sid)).experiments[eid]
    assert ev.reruns == 0
    assert ev.remeasured_text(0.95) == "kept at 0.950000 on 2 runs; now 0.925000 on 2"
    assert ev.remeasured_text(0.925) == ""  # the same value: nothing to say
    base = sweep.store.list_experiments(sweep.sid)[0]
    base_ev = sweep_evidence(s, sweep.store.list_experiments(sweep.sid),
                             sweep.store.list_runs(sweep_id=sweep.sid)).experiments[base.id]
    assert base_ev.remeasured_text(base.metric) == ""  # the baseline: its value is its mean


def test_every_rows_interval_does_not_solve_the_same_t_quantile_again(
        sweep: Sweep, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each row's 95 % interval rests on σ̂'s degrees of freedom, the same for every row: its t
    quantile (a hundred incomplete beta functions by bisection) is worked out once, not per row
    (a fresh dashboard's first view of a 10,000-run night took 33 s)."""
    for i in range(40):
        eid = sweep.start()
        sweep.run(eid, f"c{eid}", 1.0 + 0.01 * i)
        sweep.finish(eid, S.DISCARDED, 1.0 + 0.02 * i)  # two runs each: σ̂ is measured
    calls = []
    real = evidence_module.t_sf
    monkeypatch.setattr(evidence_module, "t_sf", lambda t, df: calls.append(df) or real(t, df))
    evidence_module.t_quantile.cache_clear()
    s = sweep.store.get_sweep_by_id(sweep.sid)
    ev = sweep_evidence(s, sweep.store.list_experiments(sweep.sid),
                        sweep.store.list_runs(sweep_id=sweep.sid))
    assert ev.df >= 39 and all(ev.experiments[e.id].ci for e in sweep.store.list_experiments(
        sweep.sid) if e.status is S.DISCARDED)
    assert len(calls) <= 3 * 100, len(calls)  # the rows' quantile, the header's two
