"""The default keep rule, ``sequential``: blocked in time, decided as the runs come in.

σ̂ is the pooled within-commit standard deviation of the sweep's repeated runs per machine
condition (or `noise_sigma`), drift included (agent.rules.estimate); the change is compared
with its incumbent in the same conditions (agent.rules.blocking): a run whose throughput
departs from the incumbent's latest conditions gets the incumbent run beside it, with its
seed, before anything is decided on it. z = gain / its standard error. After each run:
discard when z < discard_z; from the second run on keep when z ≥ keep_z; discard after
max_runs; otherwise run again. Nothing is kept before σ̂ has two degrees of freedom, nor
before the incumbent has KEEP_INCUMBENT_RUNS runs in the conditions the keep rests on.

Pure: the stdlib and agent.rules only.
"""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import median

from agent.core.config import Direction
from agent.core.domain import ExperimentStatus
from agent.rules.blocking import Blocks, arrange
from agent.rules.conditions import (
    Sample,
    conditions,
    incumbent_notes,
    latest_before,
    off,
    speed_text,
    usual_keys,
)
from agent.rules.estimate import Noise, estimate, gain_only, noise, values
from agent.rules.noise import identical, mean, p_better
from agent.rules.verdict import (
    NOT_BETTER,
    NOT_CLEARLY_BETTER,
    Evidence,
    Rule,
    Verdict,
    again,
    stale,
    tolerance,
)

MIN_INCUMBENT_RUNS = 2  # a decision rests on at least this many incumbent runs per condition
MIN_ELSEWHERE = 3  # ... in conditions other than the incumbent's usual ones (fresh references)
KEEP_INCUMBENT_RUNS = 3  # and a keep on this many (the baseline's runs)
MAX_SUSPECT_RERUNS = 1  # one extra baseline run when its runs' speeds swung (then: go on)
CLEARLY_WORSE = 1.5  # this far under discard_z a thin reference is enough to discard
MAX_UNUSABLE = 1  # a change's runs left out (the machine moved around them) beyond max_runs


def baseline(ev: Evidence, rule: Rule) -> Verdict:
    """The baseline's runs grouped by the machine's conditions; the first best is the mean of
    its usual condition (the most runs), once that holds two runs or the runs are done."""
    if not rule.sequential:
        values = [r.metric for r in ev.runs]
        n, want = len(values), 1 + rule.confirm_runs
        if n < want:
            return Verdict(None, seed=rule.seed + n, metric=mean(values), n=n,
                           suspect=(False,) * n)
        why = f"baseline: the mean of {n} run{'s' if n > 1 else ''}"
        return Verdict(ExperimentStatus.KEPT, why, keep=True, metric=mean(values), n=n,
                       suspect=(False,) * n)
    keys = conditions(ev.runs, tolerance(ev, rule))
    usual = usual_keys(keys)
    flags = tuple(k != usual.get(k[0]) for k in keys)
    clean = [r.metric for r, off in zip(ev.runs, flags, strict=True) if not off]
    n, want = len(ev.runs), rule.baseline_runs
    base = Verdict(None, metric=mean(clean), n=len(clean), suspect=flags,
                   notes=tuple(incumbent_notes(ev.runs, keys)))
    if n >= want and len(clean) >= min(2, want):
        why = f"baseline: the mean of {len(clean)} run{'s' if len(clean) > 1 else ''}"
        if len(clean) < n:
            why += f" at its usual speed ({n - len(clean)} more at another: the machine)"
        return replace(base, status=ExperimentStatus.KEPT, reason=why, keep=True)
    if n >= want + MAX_SUSPECT_RERUNS:  # a busy machine: go on, but say so
        values = [r.metric for r in ev.runs]
        why = (
            f"baseline: the mean of all {n} runs; their throughput swung by more "
            f"than {tolerance(ev, rule):.0%} (is the machine busy?)"
        )
        return replace(base, status=ExperimentStatus.KEPT, reason=why, keep=True,
                       metric=mean(values), n=n, suspect=(False,) * n)
    return replace(base, seed=rule.seed + n)  # run k: seed + k


def _noise(ev: Evidence, rule: Rule, blocks: Blocks) -> Noise:
    """σ̂ from the runs back to back (and the sweep's other commits), and the drift the
    incumbent's runs spread over the night show (agent.rules.estimate)."""
    if rule.noise_sigma is not None:
        return Noise(rule.noise_sigma, 1_000_000)
    return noise(blocks.back_to_back, blocks.spread, prior=ev.others)


def _z(gain: float, se: float) -> float:
    """gain / its standard error; ±inf when that is 0, 0 at 0 (noise.z_score's convention)."""
    if se > 0:
        return gain / se
    return 0.0 if gain == 0 else math.copysign(math.inf, gain)


def _pending(ev: Evidence, rule: Rule, blocks: Blocks, base: Verdict) -> Verdict:
    """The latest run has no incumbent run in its conditions: run the incumbent beside it
    (same seed), unless it is worse though faster; or stop when the machine will not hold
    still."""
    assert blocks.pending is not None
    worse = _worse_though_faster(ev, rule, blocks, base)
    if worse is not None:
        return worse
    if ev.head_moved:
        return stale(ev, replace(base, metric=_mean_left(ev, base)))
    run = ev.runs[blocks.pending]
    if _beside(ev) >= rule.max_runs or len(ev.runs) >= rule.max_runs + MAX_UNUSABLE:
        why = "discarded: the machine's speed kept changing around its runs (is it busy?)"
        return replace(base, status=ExperimentStatus.DISCARDED, reason=why,
                       metric=_mean_left(ev, base))
    seed = run.seed if run.seed is not None else rule.seed + blocks.pending
    if seed in {b.seed for b in ev.best}:  # a seed run twice measures its luck twice
        seed = fresh_seed(ev, rule)
    why = blocks.notes[blocks.pending] or "no incumbent run in its conditions yet"
    return replace(base, status=None, incumbent=True, pair_of=run.run_id or None, seed=seed,
                   reason=why)


def _worse_though_faster(ev: Evidence, rule: Rule, blocks: Blocks, base: Verdict
                         ) -> Verdict | None:
    """A first run faster than the incumbent's latest conditions yet worse than the incumbent
    there: discarded without an incumbent run beside it. On a time budget a faster machine
    trains more steps, never fewer, so that run could only have done better (None: not so,
    the incumbent runs beside it as usual)."""
    found = _faster_than_latest(ev, rule, blocks) if rule.faster_worse else None
    n = _noise(ev, rule, blocks) if found is not None else None
    if found is None or n is None or n.sigma is None:
        return None
    run, ref, level = found
    sign = 1.0 if rule.direction is Direction.MINIMIZE else -1.0
    best = sum(ref) / len(ref)
    spread = n.drift if n.drift is not None else n.sigma  # older runs: their drift too
    gain, se = sign * (best - run.metric), spread * math.sqrt(1 + 1 / len(ref))
    z = _z(gain - rule.min_delta, se)
    if z >= min(rule.discard_z, 0.0):
        return None
    p = p_better(_z(gain, se))
    usual = mean(list(blocks.usual))
    usual = best if usual is None else usual
    metric = usual - sign * gain  # its run in the incumbent's usual terms (as placed runs are)
    speed = f"{run.throughput / level - 1:+.0%}" if run.throughput else "?"
    why = (f"{NOT_BETTER}: {_describe(metric, usual, 1, z, p, n.sigma)}; run at {speed} the "
           f"speed of the incumbent's latest runs and worse than their {best:.6g}: a faster "
           "machine does not make a run worse; in the incumbent's usual terms")
    note = (f"{speed_text(run.throughput, run.source)}{off(run.throughput, level)}: faster than "
            "the incumbent's latest runs and worse than them: discarded without an incumbent "
            "run beside it")
    return replace(base, status=ExperimentStatus.DISCARDED, reason=why, metric=metric,
                   z=z, p_better=p, sigma=n.sigma, notes=(note,))


def _faster_than_latest(ev: Evidence, rule: Rule, blocks: Blocks
                        ) -> tuple[Sample, list[float], float] | None:
    """The change's only run, the metrics of the incumbent's runs in its latest conditions
    and their speed, when that run is waiting for an incumbent run and ran faster than them."""
    run = ev.runs[0] if len(ev.runs) == 1 and blocks.pending == 0 else None
    at = latest_before(run, ev.best) if run is not None else None
    if run is None or at is None or run.throughput is None:
        return None
    keys = conditions(ev.best, tolerance(ev, rule))
    ref = [b for b, k in zip(ev.best, keys, strict=True) if k == keys[at]]
    speeds = [b.throughput for b in ref if b.throughput is not None]
    level = median(speeds) if speeds else None
    if not level or run.throughput <= level:
        return None
    return run, [b.metric for b in ref], level


def _mean_left(ev: Evidence, base: Verdict) -> float | None:
    """With no comparison to state: the plain mean of its runs left OK (else of all)."""
    left = [r.metric for r, off in zip(ev.runs, base.suspect, strict=False) if not off]
    return mean(left or [r.metric for r in ev.runs])


def _beside_latest(ev: Evidence, rule: Rule, base: Verdict, why: str) -> Verdict:
    """Run the incumbent once more beside the change's latest run, with a seed it has not
    run (a seed run twice measures its luck twice)."""
    last = ev.runs[-1]
    seed = fresh_seed(ev, rule)
    return replace(base, incumbent=True, pair_of=last.run_id or None, seed=seed, reason=why)


def fresh_seed(ev: Evidence, rule: Rule) -> int:
    """The smallest seed from `rule.seed` on that the incumbent has not run."""
    used = {b.seed for b in ev.best}
    seed = rule.seed
    while seed in used:
        seed += 1
    return seed


def _beside(ev: Evidence) -> int:
    """How many incumbent runs were started beside this change's runs."""
    mine = {r.run_id for r in ev.runs if r.run_id}
    return sum(1 for b in ev.best if b.pair_of in mine)


def sequential(ev: Evidence, rule: Rule) -> Verdict:
    sign = 1.0 if rule.direction is Direction.MINIMIZE else -1.0
    blocks = arrange(ev.runs, ev.best, tolerance(ev, rule))
    base = Verdict(None, n=blocks.n, suspect=blocks.suspect, notes=blocks.notes,
                   best_suspect=blocks.best_suspect, best_notes=blocks.best_notes)
    if not ev.best:  # nothing to compare with (no baseline runs): cannot keep
        why = "no incumbent runs to compare with"
        return replace(base, status=ExperimentStatus.DISCARDED, reason=why,
                       metric=_mean_left(ev, base))
    if blocks.pending is not None:
        return _pending(ev, rule, blocks, base)
    n = _noise(ev, rule, blocks)
    sigma, df = n.sigma, n.df
    got = estimate(blocks.strata, n, sign)
    plain = gain_only(blocks.strata, sign, n.beta)
    if plain is None:  # its runs straddled changes of the machine: none is comparable yet
        base = replace(base, metric=_mean_left(ev, base))
        if len(ev.runs) >= rule.max_runs + MAX_UNUSABLE or ev.head_moved:
            why = "discarded: the machine's speed kept changing around its runs (is it busy?)"
            return replace(base, status=ExperimentStatus.DISCARDED, reason=why)
        return again(ev, rule, base)
    gain, se = got if got is not None else (plain, None)
    usual = mean(list(blocks.usual)) or 0.0
    runs_used = blocks.n
    metric = usual - sign * gain  # the change's mean in the incumbent's usual conditions
    z = p = None
    if se is not None:
        z, p = _z(gain - rule.min_delta, se), p_better(_z(gain, se))
    base = replace(base, metric=metric, z=z, p_better=p, sigma=sigma)
    text = _describe(metric, usual, runs_used, z, p, sigma) + _placed(blocks, n)
    fewest = min(len(s.incumbent(sigma, n.beta)) for s in blocks.strata)
    thin = any(len(s.incumbent(sigma, n.beta)) < (MIN_INCUMBENT_RUNS if s.usual else MIN_ELSEWHERE)
               for s in blocks.strata)
    clearly_worse = z is not None and z < rule.discard_z - CLEARLY_WORSE
    if thin and not clearly_worse and _beside(ev) < rule.max_runs and not ev.head_moved:
        return _beside_latest(ev, rule, base, f"{fewest} incumbent run(s) in these conditions "
                              "are a weak reference: the incumbent runs again beside it")
    if (z is not None and z < discard_bar(rule, runs_used)) or (
            z is None and gain - rule.min_delta <= 0):
        return replace(base, status=ExperimentStatus.DISCARDED, reason=f"{NOT_BETTER}: {text}")
    other = any(blocks.suspect) and rule.fresh_z  # compared in other machine conditions
    if z is not None and df >= 2 and runs_used >= 2 and z >= rule.keep_z + other:
        if ev.head_moved:
            return stale(ev, base)
        if blocks.unconfirmed and len(ev.runs) < rule.max_runs + MAX_UNUSABLE:
            return again(ev, rule, base)  # its own speed, if its next run keeps it
        if fewest < KEEP_INCUMBENT_RUNS and _beside(ev) < rule.max_runs:
            why = (f"would be kept ({text}), but on {fewest} incumbent runs in these "
                   "conditions: the incumbent runs again beside it first")
            return _beside_latest(ev, rule, base, why)
        return replace(base, status=ExperimentStatus.KEPT, reason=f"better: {text}", keep=True)
    if runs_used >= rule.max_runs or len(ev.runs) >= rule.max_runs + MAX_UNUSABLE:
        why = f"{NOT_CLEARLY_BETTER} after {runs_used} runs: {text}"
        if df < 2:
            why = f"not kept: the noise is not measured yet ({df} degree(s) of freedom"
            if identical(values([*blocks.back_to_back, *blocks.spread])):
                why += "; its repeats are identical: does the script ignore OVERNIGHT_SEED?"
            why += f"); {text}"
        return replace(base, status=ExperimentStatus.DISCARDED, reason=why)
    return again(ev, rule, base)


def discard_bar(rule: Rule, runs: int) -> float:
    """The z under which a change is discarded after `runs` runs: discard_z, rising towards
    keep_z at max_runs by `rule.futility` (futility: the runs left could not plausibly lift
    a change this far behind the keep bar over it)."""
    if rule.futility <= 0 or rule.max_runs <= 1 or runs <= 1:
        return rule.discard_z
    share = min(runs - 1, rule.max_runs - 1) / (rule.max_runs - 1)
    return rule.discard_z + rule.futility * share * (rule.keep_z - rule.discard_z)


def _placed(blocks: Blocks, n: Noise) -> str:
    """How the comparison was blocked, when it was more than the plain one."""
    beside = sorted({i for s in blocks.strata for i in s.beside_ids})
    shifted = sum(blocks.suspect)
    slope = n.beta and any(not s.credited for s in blocks.strata)
    if not beside and not shifted and n.drift is None and not slope:
        return ""
    parts = []
    if beside:
        parts.append("beside incumbent run" + ("s " if len(beside) > 1 else " ")
                     + ", ".join(map(str, beside)))
    if shifted:
        parts.append(f"{shifted} run{'s' if shifted > 1 else ''} in other machine conditions"
                     " compared in those conditions")
    if n.drift is not None:
        parts.append(f"the incumbent's runs spread over the night drift: σ {n.drift:.3g}")
    if slope:
        parts.append(f"at the incumbent's speed: the metric follows the machine's speed (slope "
                     f"{n.beta:.3g} per log throughput)")
    return f"; same-conditions comparison ({'; '.join(parts)}), in the incumbent's usual terms"


def _describe(
    m: float, best: float, n: int, z: float | None, p: float | None, sigma: float | None
) -> str:
    text = f"mean {m:.6g} of {n} run{'s' if n > 1 else ''} vs best {best:.6g}"
    if z is None or p is None or sigma is None:
        return text + " (noise unknown)"
    return f"{text}, σ̂ {sigma:.3g}, z {z:.2f}, P(better) {p:.2f}"


