"""Keep, discard, or run again: the loop's decision after each run, as one pure function.

`decide(evidence, rule) -> Verdict`. Pure: imports only the stdlib, the domain, classify,
config and the rules' own modules; the loop gathers the evidence (runs from the store, git's
head) and carries out the verdict. Two rules:

- ``sequential`` (default, agent.rules.sequential): blocked in time — a change is compared
  with its incumbent in the same machine conditions, the incumbent run beside a change's run
  whose throughput departs — and decided as the runs come in (discard when z < discard_z;
  from the second run on keep when z ≥ keep_z; discard after max_runs).
- ``strict``: autoresearch's rule — one run, strictly better than the best by > min_delta
  (with `confirm_runs`, a would-be keep is re-run and judged on the mean).

Run k of any commit uses seed `seed + k`, so challenger and incumbent are compared seed for
seed; the incumbent run beside a change's run takes that run's seed (unless it ran it).
"""

from __future__ import annotations

import math
from dataclasses import replace

from agent.core.config import Direction
from agent.core.domain import CrashKind, ExperimentStatus
from agent.rules.classify import classify
from agent.rules.conditions import Sample
from agent.rules.noise import mean
from agent.rules.sequential import KEEP_INCUMBENT_RUNS, baseline, sequential
from agent.rules.verdict import (
    NOT_BETTER,
    SEQUENTIAL,
    STRICT,
    Evidence,
    Rule,
    RunFailure,
    Verdict,
    again,
    judged_not_better,
    stale,
    tolerance,
)

__all__ = ["SEQUENTIAL", "STRICT", "Evidence", "Rule", "RunFailure", "Sample", "Verdict",
           "contract_warnings", "decide", "incumbent_due", "is_improvement", "judged_not_better",
           "tolerance"]


def is_improvement(
    metric: float | None,
    best: float | None,
    direction: Direction,
    min_delta: float = 0.0,
) -> bool:
    """True when `metric` beats `best` by more than `min_delta` (strictly better at 0).

    A missing or non-finite metric never wins; with no best yet, any finite metric does.
    """
    if metric is None or not math.isfinite(metric):
        return False
    if best is None or not math.isfinite(best):
        return True
    if direction is Direction.MINIMIZE:
        return metric < best - min_delta
    return metric > best + min_delta


def decide(ev: Evidence, rule: Rule) -> Verdict:
    """The verdict after the latest run of an experiment."""
    if ev.failed is not None:
        return _failure(ev, rule)
    if not rule.sequential:
        base = Verdict(
            None,
            metric=mean([r.metric for r in ev.runs]),
            n=len(ev.runs),
            suspect=(False,) * len(ev.runs),
        )
        return _strict(ev, rule, base)
    if ev.is_baseline:
        return baseline(ev, rule)
    return sequential(ev, rule)


def _failure(ev: Evidence, rule: Rule) -> Verdict:
    f = ev.failed
    assert f is not None
    if f.stopped:
        k = len(ev.runs)
        why = "cancelled while running"
        if k:
            why = f"cancelled during a confirmation run (run {k + 1})"
        return Verdict(ExperimentStatus.CANCELLED, why)
    if f.tampered:
        why = f"the run modified protected file(s): {', '.join(f.tampered)}"
        return Verdict(ExperimentStatus.CRASHED, why, CrashKind.FUNDAMENTAL)
    k = len(ev.runs)
    if f.incumbent:
        why = (f"the incumbent's run beside it failed ({f.error}): no comparison in the same "
               "conditions")
        return Verdict(ExperimentStatus.DISCARDED, why, metric=mean([r.metric for r in ev.runs]),
                       n=k)
    if k == 0 and f.facts is not None:  # the first run: classify the crash
        crash = classify(f.facts)
        status = (
            ExperimentStatus.TIMEOUT
            if crash.kind is CrashKind.TIMEOUT
            else ExperimentStatus.CRASHED
        )
        return Verdict(status, crash.reason, crash.kind, crash_cause=crash.cause or None,
                       repair=crash.kind is CrashKind.TRIVIAL)
    why = f"run {k + 1} (seed {rule.seed + k}) failed: {f.error}"
    metric = mean([r.metric for r in ev.runs])
    if ev.is_baseline:
        return Verdict(ExperimentStatus.CRASHED, why, CrashKind.FUNDAMENTAL, metric=metric, n=k)
    return Verdict(ExperimentStatus.DISCARDED, why, metric=metric, n=k)


def _strict(ev: Evidence, rule: Rule, base: Verdict) -> Verdict:
    """autoresearch's rule, with the optional confirmation runs judged on their mean."""
    values = [r.metric for r in ev.runs]
    n, m = len(values), base.metric
    assert m is not None
    if ev.is_baseline:
        return baseline(ev, rule)
    best = mean([b.metric for b in ev.best])
    text = f"{m:.6g}" + (f" (mean of {n} runs)" if n > 1 else "") + f" vs best {best}"
    judged = n == 1 or n >= 1 + rule.confirm_runs  # today's rule: first run, then the mean
    if judged and not is_improvement(m, best, rule.direction, rule.min_delta):
        why = f"{NOT_BETTER} (strict): {text}"
        return replace(base, status=ExperimentStatus.DISCARDED, reason=why)
    if n < 1 + rule.confirm_runs:
        return again(ev, rule, base)
    if ev.head_moved:
        return stale(ev, base)
    return replace(base, status=ExperimentStatus.KEPT, reason=f"better (strict): {text}", keep=True)


def incumbent_due(decided: int, incumbent_runs: int, rule: Rule,
                  best_runs: int | None = None) -> bool:
    """Whether the incumbent runs again before the next proposal (sequential only; never with
    `incumbent_every` 0): while it has fewer runs than a keep rests on (KEEP_INCUMBENT_RUNS,
    `best_runs` of it started) — a change kept on its own 2 runs, which are the runs that won
    it the keep: the next changes would be judged against their luck (the winner's curse) —
    and once every `incumbent_every` decided proposals (`incumbent_runs`: its re-runs so far,
    those beside changes included)."""
    if not rule.sequential or rule.incumbent_every <= 0:
        return False
    if rule.rerun_after_keep and best_runs is not None and 0 < best_runs < KEEP_INCUMBENT_RUNS:
        return True
    return decided // rule.incumbent_every > incumbent_runs


BUDGET_OVERSHOOT = 0.05  # training may run this share over the budget
BUDGET_UNDERSHOOT = 0.5  # a script that stops before this share of the budget ignores it


def contract_warnings(summary: dict[str, float | str], budget_s: float) -> list[str]:
    """Problems with the script contract that make runs incomparable (none = an empty list)."""
    seconds = summary.get("training_seconds")
    if not isinstance(seconds, int | float) or not math.isfinite(seconds):
        if not summary:
            return []
        return ["the summary has no training_seconds: the budget cannot be checked"]
    if seconds > budget_s * (1 + BUDGET_OVERSHOOT):
        over = seconds / budget_s - 1
        return [
            f"trained {seconds:g} s for a {budget_s:g} s budget ({over:.0%} over): "
            "runs are not comparable; does the script stop at OVERNIGHT_BUDGET_S?"
        ]
    if seconds < budget_s * BUDGET_UNDERSHOOT:
        return [
            f"trained {seconds:g} s of a {budget_s:g} s budget: does the script read "
            "OVERNIGHT_BUDGET_S?"
        ]
    return []
