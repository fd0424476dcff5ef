"""The evidence behind a sweep's results: each experiment as its record says (agent.core.record:
the runs its value rests on and their mean, measured; its difference from the incumbent runs it
was compared with ± se, P(better) and whether the test kept it, inferred), which of its runs ran
beside which incumbent runs and which were set aside (the keep rule's notes), a kept commit's
re-runs and its value now; for the sweep, σ̂ now, the smallest effect it can detect, the
improvement ± CI and an honest statement.

Pure: stdlib, the domain, config and the rules. An experiment's numbers are its record's, never
computed again (one still running: its good runs so far). σ̂ now is pooled from the run records
as the keep rule pools it. The best, the baseline and a kept commit's value now are the keep
rule's one value of a commit (agent.rules.placement.usual_runs, stored on the sweep as its best
and baseline), so the improvement is the sweep's baseline less its best.
"""

from __future__ import annotations

import functools
import math
import statistics
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from agent.analysis.folds import appended
from agent.core.config import Direction
from agent.core.domain import (
    Experiment,
    ExperimentStatus,
    Run,
    RunRole,
    RunStatus,
    Sweep,
)
from agent.core.record import JUDGED, VerdictRecord
from agent.rules import fdr
from agent.rules.decide import look_share
from agent.rules.noise import mean, pooled_of, t_sf
from agent.rules.placement import noise_part
from agent.rules.run_records import USABLE, recorded_best, runs_tolerance, sample


@dataclass(frozen=True)
class ExperimentEvidence:
    n: int  # the runs its value rests on (its record; running: its good runs so far)
    mean: float | None  # measured: their mean, the experiment's metric
    sd: float | None  # their standard deviation (measured)
    ci: float | None  # inferred: the 95 % half-width of that mean on σ̂ at its decision
    p_better: float | None  # the keep rule's, as it decided (None: not decided on a test)
    runs: tuple[float, ...]  # those runs' values
    pairs: tuple[tuple[int, int], ...] = ()  # (its run, the incumbent run beside it)
    set_aside: tuple[tuple[int, str], ...] = ()  # (its run in no value, why: the note)
    record: VerdictRecord | None = None  # every number its verdict rested on
    # the commit it made, re-run as the incumbent: those runs, and its value now as the keep
    # rule records the best (agent.rules.placement.recorded_best: what the later changes'
    # deltas are measured against) with the runs it rests on
    reruns: int = 0
    reruns_set_aside: int = 0  # of those re-runs, the ones in no value (another speed)
    commit_mean: float | None = None
    commit_n: int = 0

    def remeasured_text(self, value: float | None, verb: str = "kept") -> str:
        """"kept at 3.309303 on 2 runs; now 3.255591 on 3" when its commit's value now (the keep
        rule's record of it) is not its value then (`value`): measured again since, or its
        runs in its own machine condition are not the comparison it was kept on; else ""."""
        if self.commit_mean is None or value is None or \
                f"{value:.6f}" == f"{self.commit_mean:.6f}":
            return ""
        return (f"{verb} at {value:.6f} on {self.n} run{'s' if self.n != 1 else ''}; now "
                f"{self.commit_mean:.6f} on {self.commit_n}")


@dataclass(frozen=True)
class SweepEvidence:
    sigma: float | None  # the keep rule's σ̂: pooled within commits and machine conditions
    df: int
    detectable: float | None  # the true gain kept half the time by the last look, now
    improvement: float | None  # baseline mean − best mean, better = positive
    improvement_ci: float | None
    kept: int  # kept changes (baseline excluded)
    supported: int  # of those, kept by the test (the others: on one run, noise unmeasured)
    experiments: Mapping[int, ExperimentEvidence] = field(default_factory=dict)
    load_checked: bool | None = None  # some run reported its throughput (None: no runs yet)
    # experiments with runs in other machine conditions: set aside, or compared beside the
    # incumbent there (the sweep plot's load-shift stripes)
    load_shifts: int = 0
    compared: bool = True  # the baseline has a value: changes could be compared with it

    @property
    def best_n(self) -> int:
        """The runs the sweep's best rests on (its commit's runs in its usual condition)."""
        per = self.experiments
        return per.recorded.best_n if isinstance(per, PerExperiment) else 0

    @property
    def baseline_n(self) -> int:
        per = self.experiments
        return per.recorded.base_n if isinstance(per, PerExperiment) else 0

    def statement(self) -> str:
        """One honest line for the morning: how many keeps the noise supports."""
        if not self.compared:
            return "nothing compared: the baseline has no value"
        sigma = f"σ̂ = {self.sigma:.3g}" if self.sigma is not None else "σ̂ not measured"
        weak = self.kept - self.supported
        if self.supported:
            more = (f"; {weak} more kept on one run each, the noise not measured" if weak
                    else "")
            plural = "s" if self.supported > 1 else ""
            return f"{self.supported} change{plural} kept by the test ({sigma}){more}"
        if self.kept:
            return (f"{self.kept} change(s) kept on one run each: the noise was not measured "
                    "(identical repeats), so no keep is a tested claim")
        return f"nothing beat the noise ({sigma})"


def sweep_evidence(sweep: Sweep, experiments: list[Experiment], runs: list[Run]) -> SweepEvidence:
    """The evidence of a whole sweep from its experiments and run records."""
    fold = EvidenceFold(sweep)
    for r in runs:
        fold.add_run(r)
    for e in experiments:
        if e.status.is_finished():
            fold.add_experiment(e)
    return fold.evidence([e for e in experiments if not e.status.is_finished()])


class EvidenceFold:
    """A sweep's evidence as running state: `add_run` ended runs and `add_experiment` finished
    experiments in id order, `evidence` with the open ones; `copy` before adding to a shared
    one. Lists are replaced, never changed, so an earlier SweepEvidence stays as it was, and
    the experiments' evidence worked out before is carried over while σ̂ and their runs hold."""

    def __init__(self, sweep: Sweep) -> None:
        self.sweep = sweep
        self.by_commit: dict[str, list[float]] = {}  # good runs' metrics per commit
        self.by_exp: dict[int, list[float]] = {}  # good non-incumbent runs' per experiment
        self.bases: dict[int, str | None] = {}  # base commit ("" if none); None: a baseline
        self.based_on: dict[str, list[int]] = {}
        # per commit: σ̂'s part (agent.rules.placement.noise_part) and the (runs, tolerance) it is of
        self.parts: dict[str, tuple[tuple[int, float], tuple[float, int]]] = {}
        self.baseline: tuple[int, str] | None = None  # the first baseline: id, commit
        self.commit_of: dict[int, str] = {}  # kept experiments and baselines → their commit
        self.kept: list[int] = []  # kept changes (not the baseline)
        self.records: dict[int, VerdictRecord] = {}  # each finished experiment's record
        self.reruns: Counter[int] = Counter()  # per kept experiment: its commit's later runs
        self.reruns_aside: Counter[int] = Counter()  # of those, the ones set aside
        self.ledger: list[tuple[float, bool, object, int]] = []  # (p, kept, finished, id)
        self.run_exp: dict[int, int] = {}  # a change's run → its experiment
        self.marked: dict[int, list[Run]] = {}  # per experiment: runs paired or with a note
        self.good: dict[int, list[Run]] = {}  # [0]: every good run with a metric, in id order
        self.speeds: tuple[int, int] = (0, 0)  # (ended runs with a metric, of them with a speed)
        self.changed: set[int] = set()  # whose inputs moved since `evidence` last ran
        self.last: PerExperiment | None = None
        self.owned: set[object] = set()  # lists this holder made (agent.analysis.folds)
        self._lock = threading.Lock()

    def copy(self) -> EvidenceFold:
        out = EvidenceFold(self.sweep)
        out.by_commit, out.by_exp, out.bases = dict(self.by_commit), dict(self.by_exp), \
            dict(self.bases)
        out.based_on = dict(self.based_on)  # lists replaced before adding (agent.analysis.folds)
        out.parts = dict(self.parts)
        out.baseline, out.kept, out.changed = self.baseline, list(self.kept), set(self.changed)
        out.records, out.ledger = dict(self.records), list(self.ledger)
        out.reruns, out.reruns_aside = Counter(self.reruns), Counter(self.reruns_aside)
        out.commit_of = dict(self.commit_of)
        out.run_exp, out.marked = dict(self.run_exp), dict(self.marked)
        out.good = dict(self.good)
        out.speeds = self.speeds
        out.last = self.last
        return out

    def add_run(self, r: Run) -> None:
        self._mark(r)
        if r.metric is not None:
            self.speeds = (self.speeds[0] + 1, self.speeds[1] + (r.throughput is not None))
        if r.status in USABLE and r.metric is not None:
            appended(self.good, self.owned, "good", 0, r)
            if r.role is RunRole.INCUMBENT:  # a run of a kept commit after its verdict
                self.reruns[r.experiment_id] += 1
                self.reruns_aside[r.experiment_id] += r.status is RunStatus.SUSPECT
        if r.status is not RunStatus.OK or r.metric is None:
            return
        appended(self.by_commit, self.owned, "commit", r.commit, r.metric)
        self.changed.update(self.based_on.get(r.commit, ()))
        if r.role is not RunRole.INCUMBENT:
            appended(self.by_exp, self.owned, "exp", r.experiment_id, r.metric)
        self.changed.add(r.experiment_id)  # an incumbent re-run: the experiment that made it

    def _mark(self, r: Run) -> None:
        """Keep the runs the keep rule placed with a note or a pair, per change."""
        if r.role is not RunRole.INCUMBENT:
            self.run_exp[r.id] = r.experiment_id
        exp = self.run_exp.get(r.pair_run_id) if r.pair_run_id else (
            None if r.role is RunRole.INCUMBENT else r.experiment_id)
        if exp is not None and (r.pair_run_id or r.note or r.status is RunStatus.SUSPECT):
            appended(self.marked, self.owned, "marked", exp, r)
            self.changed.add(exp)

    def add_experiment(self, e: Experiment) -> None:
        base = None if e.is_baseline else e.base_commit or ""
        self.bases[e.id] = base
        if base is not None:
            appended(self.based_on, self.owned, "base", base, e.id)
        elif self.baseline is None:
            self.baseline = (e.id, e.commit or "")
        if e.status is ExperimentStatus.KEPT and not e.is_baseline:
            self.kept.append(e.id)
        record = e.record
        if record is not None:
            self.records[e.id] = record
            if record.p is not None:
                self.ledger.append((record.p, e.status is ExperimentStatus.KEPT, e.finished_at,
                                    e.id))
        if e.commit and (e.is_baseline or e.status is ExperimentStatus.KEPT):
            self.commit_of[e.id] = e.commit
        self.changed.add(e.id)

    def evidence(self, open_experiments: list[Experiment], sweep: Sweep | None = None
                 ) -> SweepEvidence:
        """The evidence now, with the sweep's open (queued, running) experiments; `sweep`: the
        sweep as it is now (its best), else as given when this fold was made."""
        sweep = sweep or self.sweep
        config = sweep.config
        bases = dict(self.bases)
        baseline = self.baseline
        for e in open_experiments:
            bases[e.id] = None if e.is_baseline else e.base_commit or ""
            if e.is_baseline and (baseline is None or e.id < baseline[0]):
                baseline = (e.id, e.commit or "")
        with self._lock:  # what was worked out, and what changed since, read as one
            recorded = self._recorded(sweep, baseline)
            sigma, df = self._pooled(recorded)
            per = PerExperiment(bases, self.by_exp, self.by_commit, sigma,
                                1.0 if sweep.direction is Direction.MINIMIZE else -1.0,
                                self._carried(sigma, df, open_experiments, sweep),
                                self.marked, self.commit_of, self.records, df, recorded,
                                dict(self.reruns), dict(self.reruns_aside))
            self.last, self.changed = per, set()
        order = sorted(self.ledger, key=lambda t: (t[2] is None, str(t[2]), t[3]))
        alpha = fdr.level([(p, k) for p, k, _, _ in order], config.fdr)
        level = alpha * look_share(config.max_runs, config.max_runs, alpha)
        ev = _sweep_evidence(sweep, per, baseline, self.by_commit, self.kept, df, level)
        seen, fast = self.speeds
        return replace(ev, load_checked=bool(fast) if seen else None, load_shifts=sum(
            1 for e in ev.experiments.values() if e.set_aside or e.pairs))

    def _recorded(self, sweep: Sweep, baseline: tuple[int, str] | None) -> BestRecord:
        """The record of the best, the last one while no good run came and the sweep's best
        and baseline are the same (its per-commit values are worked out once)."""
        good = self.good.get(0, [])
        last = self.last.recorded if self.last is not None else None
        if last is not None and len(last.good) == len(good) and last.key == BestRecord.key_of(
                sweep) and last.base_commit == (baseline[1] if baseline else ""):
            return last
        return BestRecord.of(sweep, tuple(good), baseline)

    def _pooled(self, recorded: BestRecord) -> tuple[float | None, int]:
        """σ̂ as the keep rule pools it (agent.engine.gather.night_noise): each commit's good
        runs per machine condition (agent.rules.placement.noise_part; identical repeats left
        out), at the sweep's speed tolerance. A commit's part is worked out again only when its
        runs (they only grow) or the tolerance moved; summed in the commits' order. A commit
        with one run has no part (most of a long night's)."""
        parts = []
        for c, runs in recorded.by_commit.items():
            if len(runs) < 2:
                continue
            key = (len(runs), recorded.tolerance)
            hit = self.parts.get(c)
            if hit is None or hit[0] != key:
                hit = self.parts[c] = (key, noise_part([sample(r) for r in runs], key[1]))
            parts.append(hit[1])
        return pooled_of(parts)

    def _carried(self, sigma: float | None, df: int, open_experiments: list[Experiment],
                 sweep: Sweep) -> dict[int, ExperimentEvidence]:
        last = self.last
        if last is None or last.sigma != sigma or last.df != df or \
                last.recorded.key != BestRecord.key_of(sweep):
            return {}
        gone = self.changed | {e.id for e in open_experiments}
        return {k: v for k, v in last.done.items() if k not in gone}


def _sweep_evidence(sweep: Sweep, per: PerExperiment, baseline: tuple[int, str] | None,
                    by_commit: Mapping[str, list[float]], kept: list[int], df: int,
                    level: float) -> SweepEvidence:
    sigma, sign = per.sigma, per.sign
    rec = per.recorded
    improvement = ci = detectable = None
    if rec.base_n and rec.best_n and sweep.baseline_metric is not None \
            and sweep.best_metric is not None:
        # the keep rule's record of both (the sweep's baseline and best), on their runs in
        # their usual machine conditions
        improvement = sign * (sweep.baseline_metric - sweep.best_metric) + 0.0  # not -0.0
        if sigma is not None:
            ci = (
                0.0
                if baseline and baseline[1] == (sweep.best_commit or "")
                else (t_quantile(0.025, df or None) * sigma
                      * math.sqrt(1 / rec.base_n + 1 / rec.best_n))
            )
    if sigma is not None and rec.best_n and level > 0:
        looks = sweep.config.max_runs
        detectable = t_quantile(level, df or None) * sigma * math.sqrt(
            1 / looks + 1 / rec.best_n) + sweep.min_delta
    supported = sum(1 for i in kept if per.passed(i))
    return SweepEvidence(sigma, df, detectable, improvement, ci, len(kept), supported, per,
                         compared=sweep.baseline_metric is not None)


@dataclass(frozen=True)
class BestRecord:
    """The keep rule's record of the best as the screens read it: the sweep's best and
    baseline values (stored by agent.engine.incumbent.record_best) and, per commit, its value
    and the runs it rests on (agent.rules.placement.recorded_best over the good runs)."""

    good: Sequence[Run]
    best_commit: str
    best: float | None
    base_commit: str
    base: float | None
    best_n: int = 0
    base_n: int = 0
    time_budget: bool = True  # False: a compute budget, where speed splits no condition
    _values: dict[str, tuple[float | None, int]] = field(  # per commit, kept by replace()
        default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, sweep: Sweep, good: Sequence[Run], baseline: tuple[int, str] | None
           ) -> BestRecord:
        out = cls(good, sweep.best_commit or "", sweep.best_metric,
                  baseline[1] if baseline else "", sweep.baseline_metric,
                  time_budget=sweep.config.time_budget)
        return replace(out, best_n=out.value(out.best_commit)[1],
                       base_n=out.value(out.base_commit)[1])

    @staticmethod
    def key_of(sweep: Sweep) -> tuple[object, ...]:
        return (sweep.best_commit, sweep.best_metric, sweep.baseline_metric)

    @property
    def key(self) -> tuple[object, ...]:
        return (self.best_commit or None, self.best, self.base)

    def value(self, commit: str) -> tuple[float | None, int]:
        """recorded_value(self.good, commit), each commit worked out once: a page of a sweep
        with hundreds of keeps asks for each (the tolerance and the grouping are the sweep's)."""
        if not commit:
            return None, 0
        if commit not in self._values:
            value, _, off = recorded_best(self.by_commit.get(commit, ()), commit, self.tolerance)
            self._values[commit] = value, sum(not o for o in off)
        return self._values[commit]

    @functools.cached_property
    def tolerance(self) -> float:
        return runs_tolerance(self.good, self.time_budget)

    @functools.cached_property
    def by_commit(self) -> dict[str, list[Run]]:
        out: dict[str, list[Run]] = {}
        for r in self.good:
            out.setdefault(r.commit or "", []).append(r)
        return out



def recorded_value(runs: Sequence[Run], commit: str | None, time_budget: bool = True
                   ) -> tuple[float | None, int]:
    """A commit's value now and the runs it rests on (its runs in its usual machine
    condition): agent.rules.placement.recorded_best, as agent.engine.incumbent stores the
    sweep's best and baseline."""
    if not commit:
        return None, 0
    value, _, off = recorded_best(runs, commit, time_budget=time_budget)
    return value, sum(not o for o in off)


class PerExperiment(Mapping[int, ExperimentEvidence]):
    """Each experiment's evidence by id, worked out the first time it is asked for: a page
    shows a few dozen of a sweep's thousands (a dict's equality and iteration otherwise).
    `done`: evidence already worked out with the same σ̂ and inputs."""

    def __init__(self, bases: dict[int, str | None], by_exp: Mapping[int, list[float]],
                 by_commit: Mapping[str, list[float]], sigma: float | None, sign: float,
                 done: dict[int, ExperimentEvidence] | None = None,
                 marked: Mapping[int, list[Run]] | None = None,
                 commit_of: Mapping[int, str] | None = None,
                 records: Mapping[int, VerdictRecord] | None = None, df: int = 0,
                 recorded: BestRecord | None = None,
                 reruns: Mapping[int, int] | None = None,
                 reruns_aside: Mapping[int, int] | None = None) -> None:
        self._bases, self._by_exp, self._by_commit = bases, by_exp, by_commit
        self.recorded = recorded or BestRecord((), "", None, "", None)
        self._marked = marked or {}
        self._commit_of = commit_of or {}
        self._records = records or {}
        self._reruns, self._reruns_aside = reruns or {}, reruns_aside or {}
        self.sigma, self.sign, self.df = sigma, sign, df
        self.done: dict[int, ExperimentEvidence] = done or {}

    def __getitem__(self, key: int) -> ExperimentEvidence:
        hit = self.done.get(key)
        if hit is None:
            record = self._records.get(key)
            hit = _one(record, self._by_exp.get(key, []), self._marked.get(key, []),
                       self.sigma, self.df)
            commit = self._commit_of.get(key, "")
            if commit:  # a kept commit (or a baseline): its value now, as the rule records it
                value, n = self.recorded.value(commit)
                hit = replace(hit, reruns=self._reruns.get(key, 0), commit_mean=value,
                              commit_n=n, reruns_set_aside=self._reruns_aside.get(key, 0))
            self.done[key] = hit
        return hit

    def passed(self, key: int) -> bool:
        """Whether the keep rule's test decided it (a p-value, not one unmeasured run)."""
        record = self._records.get(key)
        return record is not None and record.tested

    def __iter__(self) -> Iterator[int]:
        return iter(self._bases)

    def __len__(self) -> int:
        return len(self._bases)


def _one(record: VerdictRecord | None, so_far: list[float], marked: Sequence[Run] = (),
         sigma_now: float | None = None, df_now: int = 0) -> ExperimentEvidence:
    """One experiment: its record's runs, mean, P(better) and interval (on σ̂ at its decision);
    without a record (still running, or from before records), its good runs so far on σ̂ now."""
    pairs = tuple((r.pair_run_id, r.id) for r in marked if r.pair_run_id)
    aside = tuple((r.id, r.note or "") for r in marked
                  if r.status is RunStatus.SUSPECT and not r.pair_run_id)
    if record is not None and (record.change.n or record.ending not in JUDGED):
        values = record.change.values
        sigma, df = record.sigma, record.df
        ids = set(record.set_aside)
        aside = tuple((i, why) for i, why in aside if i in ids) + tuple(
            (i, "") for i in record.set_aside if i not in {a for a, _ in aside})
    else:
        values, sigma, df = tuple(so_far), sigma_now, df_now
    sd = statistics.stdev(values) if len(values) > 1 else None
    n = len(values)
    return ExperimentEvidence(
        n, mean(values), sd, _ci95(n, sigma, df, sd),
        record.p_better if record is not None else None, tuple(values), pairs, aside, record)


def _ci95(n: int, sigma: float | None, df: int, sd: float | None) -> float | None:
    """Half-width of the 95 % interval of the value: t(0.975)·s/√n, on σ̂ and its degrees of
    freedom when there is one, else on the runs' own sd (none when they are identical: a zero
    width would claim what identical repeats cannot measure)."""
    if sigma is None:
        sigma, df = (sd, n - 1) if sd else (None, 0)
    if sigma is None or not n:
        return None
    return t_quantile(0.025, df or None) * sigma / math.sqrt(n)


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, df: float | None) -> float:
    """The t with P(T ≥ t) = p (bisection on agent.rules.noise.t_sf; the normal's when df is
    None). Remembered: every row of a long night asks for the same one (σ̂'s df), and each
    costs a hundred incomplete beta functions."""
    if df is None:
        return statistics.NormalDist().inv_cdf(1.0 - p)
    lo, hi = -1e3, 1e3
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_sf(mid, df) > p else (lo, mid)
    return (lo + hi) / 2
