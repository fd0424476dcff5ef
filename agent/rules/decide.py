"""The keep rule: after each run of an experiment, keep, discard, run again, or run the incumbent
beside it. One pure function, `decide(evidence, rule) -> Verdict`; docs/keep-rule.md is its spec
(the model, the four outcomes, every setting). Pure: the stdlib, the domain, config, classify
and the rules' noise, conditions and fdr.
"""
from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist, fmean

from agent.core.bounds import Bound, BoundCheck, check
from agent.core.config import Direction, TargetConfig
from agent.core.domain import CrashKind, ExperimentStatus
from agent.core.record import Ending, Measured, StopPoint, VerdictRecord
from agent.rules import fdr
from agent.rules.classify import CrashFacts, classify
from agent.rules.noise import pooled_of, speed_tolerance, squared_deviations, t_score, t_sf
from agent.rules.placement import (
    Condition,
    Placement,
    Sample,
    blocks,
    conditions,
    most_common,
    place,
    usual_runs,
)
from agent.rules.wording import comparison, margin_text

SEQUENTIAL, STRICT = "sequential", "strict"
NOT_BETTER = "not better"  # how a discard judged on its runs starts (its reason's first words)


@dataclass(frozen=True)
class Rule:
    """The decision's settings (from overnight.toml and the sweep)."""

    direction: Direction = Direction.MINIMIZE
    decision: str = SEQUENTIAL
    min_delta: float = 0.0
    seed: int = 42
    fdr: float = 0.2
    discard_below: float = 0.5
    max_runs: int = 4
    baseline_runs: int = 5
    incumbent_every: int = 8
    confirm_runs: int = 0  # strict only: extra runs of a would-be keep and of the baseline
    time_budget: bool = True  # False: a compute budget, where speed splits no condition
    constraints: tuple[Bound, ...] = ()  # [target.constraints] (agent.core.bounds)
    simplicity_margin: float = 0.0  # a change removing lines may be this much worse

    @classmethod
    def of(cls, config: TargetConfig) -> Rule:
        return cls(Direction(config.direction), config.decision, config.min_delta, config.seed,
                   config.fdr, config.discard_below, config.max_runs, config.baseline_runs,
                   config.incumbent_every, config.confirm_runs, config.time_budget,
                   config.constraints, config.simplicity_margin)

    def tolerance(self, speed_noise: float | None) -> float:
        """The speed tolerance of the machine's conditions (docs/keep-rule.md#the-model)."""
        return speed_tolerance(speed_noise, self.time_budget)


@dataclass(frozen=True)
class RunFailure:
    """The latest run ended without a usable metric (or was stopped, or cheated)."""

    stopped: bool = False
    incumbent: bool = False  # the incumbent's run beside the change failed, not the change's
    tampered: tuple[str, ...] = ()
    facts: CrashFacts | None = None
    error: str = ""  # one line: why, for later runs
    early_stop: StopPoint | None = None  # its run was stopped early (agent.engine.early_stop)


@dataclass(frozen=True)
class Evidence:
    """Everything the decision looks at, gathered by the loop."""

    is_baseline: bool
    runs: tuple[Sample, ...]  # this experiment's good runs, oldest first
    best: tuple[Sample, ...] = ()  # the good runs of the commit it was built on
    others: tuple[float, int] = (0.0, 0)  # σ̂'s parts from other commits (conditions.within)
    failed: RunFailure | None = None  # the latest run, when it produced no metric
    speed_noise: float | None = None  # run-to-run σ of log throughput (noise.speed_noise)
    head_moved: bool = False  # another slot kept a change since this one started
    conflict: str | None = None  # git's message when the diff no longer applies there
    tests: tuple[tuple[float, bool], ...] = ()  # the night's earlier tests: (p-value, kept)
    started_seeds: frozenset[int] = frozenset()  # seeds the incumbent's runs started with
    lines: int = 0  # net lines the change adds to the editable files (< 0: it removes code)


@dataclass(frozen=True)
class Verdict:
    """What the rule says after a run: a finished experiment's ending (status, ending, reason and
    every number it rested on, the record) or what runs next (seed, the incumbent beside)."""

    status: ExperimentStatus | None  # None: not finished, run again
    reason: str = ""
    crash_kind: CrashKind | None = None
    crash_cause: str | None = None  # classify's fine cause of a crash
    keep: bool = False
    seed: int | None = None  # the seed of the next run (the change's, or the incumbent's)
    requeue: bool = False  # measured on a stale head: queue the same diff on the new head
    repair: bool = False  # a trivial crash: ask the proposer for a fix
    ending: Ending | None = None  # how it ended (set with status)
    change: Measured = field(default_factory=Measured)  # its runs its value rests on (measured)
    set_aside: tuple[int, ...] = ()  # its runs left out: another machine speed
    compared_with: Measured | None = None  # the incumbent runs it was compared with (measured)
    best: Measured | None = None  # the best at this moment: its runs in its usual condition
    difference: float | None = None  # change − incumbent within conditions (inferred)
    se: float | None = None
    p_better: float | None = None  # P(T ≤ gain / se): the confidence that it is better
    sigma: float | None = None
    df: int = 0
    p_value: float | None = None  # the look's p over its share: the night's FDR ledger's
    level: float | None = None  # the night's level α_t: kept when p_value ≤ it
    stopped: StopPoint | None = None  # an early stop: where its run ended
    beside: bool = False  # each incumbent run compared with ran beside one of its runs
    blocks: tuple[tuple[Measured, Measured], ...] = ()  # per machine condition compared in
    suspect: tuple[bool, ...] = field(default_factory=tuple)  # per run: set aside (no value)
    notes: tuple[str, ...] = ()  # per run of `runs`: how it was placed
    best_notes: tuple[str, ...] = ()  # per run of `best`
    incumbent: bool = False  # the next run is the incumbent's, beside run `pair_of`
    pair_of: int | None = None
    margin: float | None = None  # what the gain had to exceed, when not min_delta alone
    lines: int | None = None  # the net lines a change adds (None: none, or the baseline)
    bounds: tuple[BoundCheck, ...] = ()  # its bounds, as checked on its runs

    @property
    def metric(self) -> float | None:
        """The change's value: the mean of its runs it rests on (measured, never inferred)."""
        return self.change.mean

    @property
    def n(self) -> int:
        return self.change.n

    def record(self) -> VerdictRecord:
        """The numbers it decided on, as written with the experiment's end."""
        assert self.ending is not None, "only a finished verdict has a record"
        return VerdictRecord(self.ending, self.change, self.set_aside, self.compared_with,
                             self.best, self.difference, self.se, self.sigma, self.df,
                             self.p_value, self.level, self.p_better, self.stopped,
                             self.beside, self.blocks, self.margin, self.lines, self.bounds)


def decide(ev: Evidence, rule: Rule) -> Verdict:
    """The verdict after the latest run of an experiment."""
    if ev.failed is not None:
        v = _failure(ev, rule)
        if ev.best and not ev.is_baseline:  # the best then, for its record
            v = replace(v, best=usual_runs(ev.best, rule.tolerance(ev.speed_noise))[0])
        return v
    if ev.is_baseline:
        return _baseline(ev, rule)
    if rule.decision == STRICT:
        return _strict(ev, rule)
    return _change(ev, rule)


def is_improvement(metric: float | None, best: float | None, direction: Direction,
                   min_delta: float = 0.0) -> bool:
    """True when `metric` beats `best` by more than `min_delta` (strictly better at 0). A
    missing or non-finite metric never wins; with no best yet, any finite metric does."""
    if metric is None or not math.isfinite(metric):
        return False
    if best is None or not math.isfinite(best):
        return True
    sign = 1.0 if direction is Direction.MINIMIZE else -1.0
    return sign * (best - metric) > min_delta


def next_seed(used: Collection[int | None], rule: Rule, prefer: int | None = None) -> int:
    """The one seed picker: `prefer` (the seed of the change's run an incumbent run goes
    beside) unless a run already started with it, else the smallest seed from rule.seed on
    that none did (a seed run twice measures its luck twice)."""
    if prefer is not None and prefer not in used:
        return prefer
    seed = rule.seed
    while seed in used:
        seed += 1
    return seed


def incumbent_due(decided: int, incumbent_runs: int, rule: Rule,
                  noise_measured: bool = True) -> bool:
    """Whether the incumbent runs again before the next proposal: once every `incumbent_every`
    decided proposals (its runs beside changes count), to follow a machine that drifts. Never
    with the strict rule, `incumbent_every` 0, or unmeasured noise (repeats say nothing)."""
    if rule.decision == STRICT or rule.incumbent_every <= 0 or not noise_measured:
        return False
    return decided // rule.incumbent_every > incumbent_runs


# The futility stop's error (agent.rules.prune): a change whose curve is not behind the incumbent's
# at any check is stopped with probability at most this, over all its runs and checks.
FUTILITY_ERROR = 0.01


def stop_level(rule: Rule) -> float:
    """The early stop's bar (agent.rules.prune), a futility boundary spent evenly: each of the
    K − 1 checks of each of a change's K runs stops at level β / (K(K − 1)), β =
    FUTILITY_ERROR, so by Bonferroni a change not behind at any check is stopped with
    probability at most β. Non-binding: the keep's α is spent as if no run were stopped."""
    k = rule.max_runs
    return FUTILITY_ERROR / (k * (k - 1)) if k > 1 else 0.0


def look_share(k: int, looks: int, alpha: float) -> float:
    """s_k, the share of α spent at look k of K = `looks`, α(k/K) by look k; they sum to 1. The
    first keeps nothing (one run can be a spike or a heavy tail): its part goes to the second."""
    k = min(k, looks)
    if k < 2 or alpha <= 0:
        return 0.0
    before = alpha_spent((k - 1) / looks, alpha) if k > 2 else 0.0
    return (alpha_spent(k / looks, alpha) - before) / alpha


def alpha_spent(s: float, alpha: float) -> float:
    """Lan and DeMets's O'Brien–Fleming-type spending function: α(s) = 2 − 2Φ(Φ⁻¹(1 − α/2)/√s)
    spent by information fraction s. It has no constant and spends less early the smaller α."""
    return math.erfc(-NormalDist().inv_cdf(alpha / 2) / math.sqrt(2 * s)) if alpha > 0 else 0.0


def _own(runs: Sequence[Sample]) -> Measured:
    return Measured(tuple(r.run_id for r in runs), tuple(r.metric for r in runs))


def _failure(ev: Evidence, rule: Rule) -> Verdict:
    f = ev.failed
    assert f is not None
    k = len(ev.runs)
    so_far = _own(ev.runs)  # its runs before the one that failed: measured
    if f.stopped:
        why = f"cancelled during a confirmation run (run {k + 1})" if k else \
            "cancelled while running"
        return Verdict(ExperimentStatus.CANCELLED, why, ending=Ending.CANCELLED, change=so_far)
    if f.tampered:
        why = f"the run modified protected file(s): {', '.join(f.tampered)}"
        return Verdict(ExperimentStatus.CRASHED, why, CrashKind.FUNDAMENTAL,
                       ending=Ending.TAMPERED)
    if f.early_stop is not None and not ev.is_baseline:
        return Verdict(ExperimentStatus.DISCARDED, f.error or "stopped early: behind the "
                       "incumbent", ending=Ending.STOPPED_EARLY, change=so_far,
                       stopped=f.early_stop)
    if f.incumbent:
        why = f"the incumbent's run beside it failed ({f.error}): no comparison"
        return Verdict(ExperimentStatus.DISCARDED, why, ending=Ending.NO_COMPARISON,
                       change=so_far)
    if k == 0 and f.facts is not None:  # the first run: classify the crash
        crash = classify(f.facts)
        timeout = crash.kind is CrashKind.TIMEOUT
        return Verdict(ExperimentStatus.TIMEOUT if timeout else ExperimentStatus.CRASHED,
                       crash.reason, crash.kind, crash_cause=crash.cause or None,
                       repair=crash.kind is CrashKind.TRIVIAL,
                       ending=Ending.TIMEOUT if timeout else Ending.CRASHED)
    why = f"its run {k + 1} failed: {f.error}"
    if ev.is_baseline:
        return Verdict(ExperimentStatus.CRASHED, why, CrashKind.FUNDAMENTAL,
                       ending=Ending.RUN_FAILED, change=so_far)
    return Verdict(ExperimentStatus.DISCARDED, why, ending=Ending.RUN_FAILED, change=so_far)


def _baseline(ev: Evidence, rule: Rule) -> Verdict:
    """The first incumbent: `baseline_runs` runs (1 + confirm_runs for strict), all of them even
    when the first repeats are identical; its value is the mean in its usual condition."""
    n = len(ev.runs)
    want = rule.baseline_runs if rule.decision == SEQUENTIAL else 1 + rule.confirm_runs
    usual_of, other_speed = usual_runs(ev.runs, rule.tolerance(ev.speed_noise))
    base = Verdict(None, change=usual_of, suspect=tuple(other_speed),
                   set_aside=tuple(r.run_id for r, o in zip(ev.runs, other_speed, strict=True)
                                   if o),
                   notes=tuple("ran at another speed than most of the baseline's runs, so it is "
                               "left out of its value" if o else "" for o in other_speed))
    if n < want:
        return replace(base, seed=next_seed({r.seed for r in ev.runs}, rule))
    why = f"baseline: the mean of {base.n} run{'s' if base.n > 1 else ''}"
    if any(other_speed):
        why += f" ({sum(other_speed)} more ran at another speed: set aside)"
    if n >= 2 and len({r.metric for r in ev.runs}) == 1:
        why += " (identical repeats: the noise cannot be measured)"
    return replace(base, status=ExperimentStatus.KEPT, reason=why, keep=True,
                   ending=Ending.BASELINE)


def _strict(ev: Evidence, rule: Rule) -> Verdict:
    """autoresearch's rule: one run, strictly better than the best by more than min_delta
    (with `confirm_runs`, a would-be keep runs again and the mean is judged); the best is the
    rule's one value of it (its runs in its usual condition)."""
    own = _own(ev.runs)
    best = usual_runs(ev.best, rule.tolerance(ev.speed_noise))[0]
    m, b = own.mean, best.mean
    base = _weighed(ev, rule, Verdict(
        None, change=own, compared_with=best, best=best,
        difference=None if m is None or b is None else m - b, suspect=(False,) * own.n))
    if any(c.broken for c in base.bounds):
        return _over_bound(base)
    text = compared_text(base, rule.direction, rule.time_budget) + _asked(base)
    if not is_improvement(m, b, rule.direction, _delta(base, rule)):
        return replace(base, status=ExperimentStatus.DISCARDED, ending=Ending.NOT_BETTER,
                       reason=f"{NOT_BETTER} (strict): {text}")
    if own.n < 1 + rule.confirm_runs:
        return replace(base, seed=next_seed({r.seed for r in ev.runs}, rule))
    if ev.head_moved:
        return _branch_moved(ev, base)
    return replace(base, status=ExperimentStatus.KEPT, keep=True, ending=Ending.KEPT,
                   reason=f"{_kept_word(base)} (strict): {text}")


@dataclass(frozen=True)
class Comparison:
    gain: float  # better = positive
    se: float | None  # None: no σ̂
    sigma: float | None
    df: int
    change: Measured  # the change's runs placed in a condition
    compared_with: Measured  # the incumbent's runs in those conditions
    best: Measured  # the incumbent's value: its runs in its usual condition
    beside: bool  # each of those incumbent runs ran beside one of the change's
    blocks: tuple[tuple[Measured, Measured], ...] = ()  # per condition: (its runs, the incumbent's)


def compare(runs: Sequence[Sample], best: Sequence[Sample], pl: Placement,
            keys: Sequence[Condition], others: tuple[float, int], rule: Rule, tol: float
            ) -> Comparison | None:
    """The change against its incumbent within conditions (docs/keep-rule.md#the-model);
    None when none of its runs is placed."""
    sign = 1.0 if rule.direction is Direction.MINIMIZE else -1.0
    total = weight = 0.0
    used = list(dict.fromkeys(k for k in pl.keys if k is not None))
    for key in used:
        change_values = [r.metric for r, k in zip(runs, pl.keys, strict=True) if k == key]
        incumbent_values = [b.metric for b, k in zip(best, keys, strict=True) if k == key]
        w = 1.0 / (1.0 / len(change_values) + 1.0 / len(incumbent_values))
        gain = fmean(incumbent_values) - fmean(change_values)
        total += w * sign * gain
        weight += w
    if not weight:
        return None
    sigma, df = pooled_of([squared_deviations(blocks(runs, pl.keys) + blocks(best, keys))],
                          others)
    value = usual_runs(best, tol)[0]
    assert value.n
    se = None if sigma is None else sigma / math.sqrt(weight)
    placed = [r for r, k in zip(runs, pl.keys, strict=True) if k is not None]
    against = [b for b, k in zip(best, keys, strict=True) if k in used]
    ids = {r.run_id for r in runs if r.run_id}
    per = tuple((_own([r for r, k in zip(runs, pl.keys, strict=True) if k == key]),
                 _own([b for b, k in zip(best, keys, strict=True) if k == key])) for key in used)
    return Comparison(total / weight, se, sigma, df, _own(placed), _own(against), value,
                      bool(ids) and all(b.pair_of in ids for b in against), per)


def _change(ev: Evidence, rule: Rule) -> Verdict:
    """The sequential test of a change (docs/keep-rule.md#the-four-outcomes)."""
    tol = rule.tolerance(ev.speed_noise)
    pl = place(ev.runs, ev.best, tol)
    keys = conditions(ev.best, tol)
    usual_key = most_common(keys)
    base = Verdict(None, suspect=tuple(k is None for k in pl.keys),  # set aside: in no value
                   change=_own([r for r, k in zip(ev.runs, pl.keys, strict=True)
                                if k is not None]),
                   set_aside=tuple(r.run_id for r, k in zip(ev.runs, pl.keys, strict=True)
                                   if k is None),
                   best=usual_runs(ev.best, tol)[0] if ev.best else None,
                   notes=pl.notes, best_notes=tuple(
                       "" if k == usual_key else "ran at another speed than the incumbent's "
                       "usual one" for k in keys))
    if not ev.best:
        return replace(base, status=ExperimentStatus.DISCARDED, ending=Ending.NO_COMPARISON,
                       change=_own(ev.runs), set_aside=(),
                       reason="no incumbent runs to compare with")
    cmp = None if pl.pending else compare(ev.runs, ev.best, pl, keys, ev.others, rule, tol)
    if cmp is not None:
        sign = 1.0 if rule.direction is Direction.MINIMIZE else -1.0
        base = replace(base, change=cmp.change, compared_with=cmp.compared_with, best=cmp.best,
                       difference=-sign * cmp.gain, se=cmp.se, sigma=cmp.sigma, df=cmp.df,
                       beside=cmp.beside, blocks=cmp.blocks)
    base = _weighed(ev, rule, base)
    if any(c.broken for c in base.bounds):
        return _over_bound(base)
    if cmp is None:
        return _unplaced(ev, rule, pl, base)
    if cmp.se is None:
        return _without_noise(ev, rule, cmp, base)
    return _test(ev, rule, pl, keys, cmp, base)


def _unplaced(ev: Evidence, rule: Rule, pl: Placement, base: Verdict) -> Verdict:
    """Not compared: its latest run has no condition yet (pending: the incumbent runs beside
    it, with its seed), or every run was left out (its next run gets an incumbent run beside)."""
    if ev.head_moved:
        return _branch_moved(ev, base)
    if (pl.beside if pl.pending else len(ev.runs)) >= rule.max_runs:
        return _speed_kept_changing(pl, base)
    if pl.pending:
        return _incumbent_beside(ev, rule, base, pl.notes[-1] or "the incumbent runs next to it")
    return replace(base, seed=next_seed({r.seed for r in ev.runs}, rule))


def _incumbent_beside(ev: Evidence, rule: Rule, base: Verdict, why: str) -> Verdict:
    """Run the incumbent beside the change's latest run, with that run's seed if it can."""
    last = ev.runs[-1]
    used = ev.started_seeds | {b.seed for b in ev.best if b.seed is not None}
    return replace(base, incumbent=True, pair_of=last.run_id or None, reason=why,
                   seed=next_seed(used, rule, prefer=last.seed))


def _speed_kept_changing(pl: Placement, base: Verdict, text: str = "") -> Verdict:
    """Never compared at one speed (no condition, or pairs that never agree on its speed):
    discarded unjudged, with no test in the night's ledger; its value is its placed runs'."""
    why = (f"not judged: better beside the incumbent ({text}), but " if text else
           "not judged: ") + "the machine's speed kept changing around its runs" + (
        f" (its speed over the incumbent's: {', '.join(f'×{x:.2g}' for x in pl.ratios)})"
        if pl.ratios else "")
    return replace(base, status=ExperimentStatus.DISCARDED, reason=why,
                   ending=Ending.NOT_JUDGED, p_value=None, p_better=None)


def _without_noise(ev: Evidence, rule: Rule, cmp: Comparison, base: Verdict) -> Verdict:
    """No σ̂: the single comparison, better by more than min_delta."""
    why = ("the noise is not measured (the baseline's repeats were identical: does the script "
           "ignore OVERNIGHT_SEED?)" if rule.baseline_runs >= 2 else
           "the noise is not measured (baseline_runs = 1)")
    text = f"{compared_text(base, rule.direction, rule.time_budget)}; {why}{_asked(base)}"
    if cmp.gain - _delta(base, rule) <= 0:
        return replace(base, status=ExperimentStatus.DISCARDED, reason=f"{NOT_BETTER}: {text}",
                       ending=Ending.NOT_BETTER)
    if ev.head_moved:
        return _branch_moved(ev, base)
    return replace(base, status=ExperimentStatus.KEPT, reason=f"{_kept_word(base)}: {text}",
                   keep=True, ending=Ending.KEPT)


def _test(ev: Evidence, rule: Rule, pl: Placement, keys: Sequence[Condition], cmp: Comparison,
          base: Verdict) -> Verdict:
    """Look k of the sequential test: discard, balance the latest condition, keep, or run."""
    t, base, text = _look(ev, rule, cmp, base)
    if t < rule.discard_below * min(len(ev.runs), rule.max_runs):
        return replace(base, status=ExperimentStatus.DISCARDED, reason=f"{NOT_BETTER}: {text}",
                       ending=Ending.NOT_BETTER)
    if _incumbent_short(ev, pl, keys) and pl.beside < rule.max_runs and not ev.head_moved:
        return _incumbent_beside(ev, rule, base, "the incumbent has fewer runs than this change "
                                 "at this speed, so it runs once more before the decision")
    better = base.p_value is not None and base.level is not None and base.p_value <= base.level
    last = len(ev.runs) >= rule.max_runs
    if ev.head_moved and (not last or better and pl.ratio_confirmed):
        return _branch_moved(ev, base)
    if better and pl.ratio_confirmed:
        return replace(base, status=ExperimentStatus.KEPT, reason=f"{_kept_word(base)}: {text}",
                       keep=True, ending=Ending.KEPT)
    if last:
        return _speed_kept_changing(pl, base, text) if better else replace(
            base, status=ExperimentStatus.DISCARDED, reason=f"{NOT_BETTER}: {text}",
            ending=Ending.NOT_BETTER)
    text += "; its effect on speed is not confirmed yet, so it runs once more" if better else ""
    return replace(base, seed=next_seed({r.seed for r in ev.runs}, rule), reason=text)


def _look(ev: Evidence, rule: Rule, cmp: Comparison, base: Verdict) -> tuple[float, Verdict, str]:
    """The look's t, the verdict carrying its p (over the look's share of the level; 1 at the
    first look, which keeps nothing) and the night's level, and the reason's text."""
    assert cmp.se is not None
    level = fdr.level(ev.tests, rule.fdr)
    s_k = look_share(len(ev.runs), rule.max_runs, level)
    t = t_score(cmp.gain - _delta(base, rule), cmp.se)
    p = min(1.0, t_sf(t, cmp.df or None) / s_k) if s_k else 1.0
    base = replace(base, p_better=1.0 - t_sf(t_score(cmp.gain, cmp.se), cmp.df or None),
                   p_value=p, level=level)
    return t, base, (
        f"{compared_text(base, rule.direction, rule.time_budget)} (σ̂ {cmp.sigma:.3g}, "
        f"{cmp.df or '∞'} df): t {t:.2f}, "
        + (f"p {p:.2g}, level {level:.2g}" if len(ev.runs) > 1 else "a first run keeps nothing")
        + _asked(base))


def _incumbent_short(ev: Evidence, pl: Placement, keys: Sequence[Condition]) -> bool:
    """The change's latest run has no pair and its condition holds fewer incumbent runs than
    change runs (equal numbers halve the standard error most for the runs spent)."""
    key, last = pl.keys[-1], ev.runs[-1]
    if key is None or any(b.pair_of == last.run_id for b in ev.best if last.run_id):
        return False
    return sum(k == key for k in keys) < sum(k == key for k in pl.keys)


def _branch_moved(ev: Evidence, base: Verdict) -> Verdict:
    why = (f"promising, but conflicts with the change kept meanwhile: {ev.conflict}" if ev.conflict
           else "promising, but the branch moved while it ran; re-queued on the new head")
    return replace(base, status=ExperimentStatus.DISCARDED, reason=why, requeue=not ev.conflict,
                   ending=Ending.CONFLICT if ev.conflict else Ending.REQUEUED)


def compared_text(v: Verdict, direction: Direction, by_speed: bool = True) -> str:
    """The comparison as a reason says it: what its own runs measured, then its difference from
    the incumbent runs it was compared with, naming them (agent.rules.wording.comparison)."""
    return comparison(v.change, v.compared_with, v.difference, v.se, direction, v.beside,
                      len(v.blocks), by_speed)


def _weighed(ev: Evidence, rule: Rule, base: Verdict) -> Verdict:
    """What the change is weighed on besides its metric (docs/keep-rule.md#constraints-and-
    simplicity): its bounds, checked on the runs its value rests on (all its runs before one
    is placed) against the incumbent runs it was compared with (the best's before); and the
    margin its gain must exceed: min_delta, plus each soft bound's cost, less
    `simplicity_margin` when it removes lines."""
    checks: tuple[BoundCheck, ...] = ()
    if rule.constraints:
        ids = set(base.change.runs) or {r.run_id for r in ev.runs}
        against = base.compared_with if base.compared_with is not None else base.best
        ref = set(against.runs) if against is not None else set()
        own = [r for r in ev.runs if r.run_id in ids]
        inc = [b for b in ev.best if b.run_id in ref]
        checks = tuple(check(b, [v for r in own if (v := r.value(b.key)) is not None],
                             [v for r in inc if (v := r.value(b.key)) is not None])
                       for b in rule.constraints)
    simpler = rule.simplicity_margin if ev.lines < 0 else 0.0
    margin = rule.min_delta + sum(c.cost for c in checks) - simpler
    return replace(base, bounds=checks, lines=ev.lines or None,
                   margin=None if margin == rule.min_delta else margin)


def _asked(v: Verdict) -> str:
    """What the test asked beyond min_delta, for the reason's end (wording.margin_text)."""
    return margin_text(v.bounds, v.lines, v.margin)


def _kept_word(v: Verdict) -> str:
    """How a keep's reason starts: "better", or "not worse" for a simplification kept on the
    simplicity margin (its gain need not be positive)."""
    return "not worse" if v.margin is not None and v.margin < 0 and (v.lines or 0) < 0 \
        else "better"


def _delta(v: Verdict, rule: Rule) -> float:
    """What the gain must exceed: min_delta, or the margin `_weighed` set."""
    return rule.min_delta if v.margin is None else v.margin


def _over_bound(base: Verdict) -> Verdict:
    """Past a hard bound: discarded with the bound, whatever its metric; no test in the night's
    ledger."""
    why = "; ".join(c.text() for c in base.bounds if c.broken)
    return replace(base, status=ExperimentStatus.DISCARDED, reason=f"over a bound: {why}",
                   ending=Ending.OVER_BOUND, p_value=None, level=None)
