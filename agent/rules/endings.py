"""Every way an experiment ends is a Verdict, and `finish_of` is the one place a verdict becomes
what is written with the experiment (agent.core.domain.Finish, its record in meta["verdict"]).

The keep rule's own endings come from agent.rules.decide.decide (keep, not better, not judged,
stopped early, no comparison, re-queued, conflict, a failed or tampered run, a crash). The rest
are here, each a pure function of what happened: a proposal refused before it ran, a cancel, an
interruption, a run the executor could not start, the crash cap (a change whose run was cut off
each time the service died), a run that had been stopped early when the service went, and an
ablation or confirmation variant's measurement. Pure: the stdlib, the domain, the record and the
rules' placement only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from agent.core.domain import CrashKind, ExperimentStatus, Finish
from agent.core.record import Ending, StopPoint, VerdictRecord
from agent.rules.decide import Verdict
from agent.rules.placement import Sample, usual_runs

# A change whose code was running each time the service died, this many times in a row, is given
# up with a verdict (it may be what takes the service down); a baseline is never given up.
MAX_CRASH_RETRIES = 3
GAVE_UP_CAUSE = "took the service down"


def refused(why: str) -> Verdict:
    """Never ran: its diff no longer applies, a protected file changed, or admission said no."""
    return Verdict(ExperimentStatus.REJECTED, why, ending=Ending.REFUSED)


def cancelled(why: str) -> Verdict:
    return Verdict(ExperimentStatus.CANCELLED, why, ending=Ending.CANCELLED)


def interrupted(why: str, on_purpose: bool = False) -> Verdict:
    """The service (or its worker, or the disk) stopped under it: no result; queued again.
    `on_purpose`: a shutdown, Ctrl-C or SIGTERM, which the crash cap does not count."""
    return Verdict(ExperimentStatus.INTERRUPTED, why,
                   ending=Ending.SHUT_DOWN if on_purpose else Ending.INTERRUPTED)


def not_started(why: str) -> Verdict:
    """The executor could not start its run (sbatch refused the job, no node fits, no GPU): no
    result, not judged, not a crash; `why` is the executor's sentence with the fix. Recorded
    `cancelled` (a run the service did not make, which uses none of the sweep's experiments);
    queued again."""
    return Verdict(ExperimentStatus.CANCELLED, why, ending=Ending.NOT_STARTED)


def on_purpose(record: VerdictRecord | None) -> bool:
    """Whether an interruption was asked for (a shutdown, Ctrl-C, SIGTERM): a row the store
    reaped after its process died has no record, and counts as a crash."""
    return record is not None and record.ending is Ending.SHUT_DOWN


def gave_up(crashes: int) -> Verdict | None:
    """The crash cap: a change whose run was cut off each of more than MAX_CRASH_RETRIES
    service deaths is crashed (fundamental); None while it may run again."""
    if crashes <= MAX_CRASH_RETRIES:
        return None
    return Verdict(ExperimentStatus.CRASHED, f"{GAVE_UP_CAUSE}: its run was cut off each of the "
                   f"{crashes} times the service or its worker died, so it is given up",
                   CrashKind.FUNDAMENTAL, crash_cause=GAVE_UP_CAUSE, ending=Ending.GAVE_UP)


def stopped_before_restart(note: str | None, point: StopPoint) -> Verdict:
    """Its run had been stopped early (a finished run) when the service went: discarded, never
    run again."""
    return Verdict(ExperimentStatus.DISCARDED, note or "stopped early: behind the incumbent",
                   ending=Ending.STOPPED_EARLY, stopped=point)


def measured_variant(runs: Sequence[Sample], tolerance: float, kind: str, what: str,
                     best: bool) -> Verdict:
    """An ablation or confirmation variant after its runs: its value is the keep rule's one
    value of a commit (its runs in its usual condition); the best variant is recorded kept (its
    sweep's baseline), the others discarded. No test: nothing moves."""
    value, off = usual_runs(runs, tolerance)
    aside = tuple(r.run_id for r, o in zip(runs, off, strict=True) if o)
    return Verdict(ExperimentStatus.KEPT if best else ExperimentStatus.DISCARDED,
                   f"{kind}: {what}: the mean of {value.n} run{'s' if value.n != 1 else ''}"
                   + (f" ({len(aside)} more ran at another speed: set aside)" if aside else ""),
                   keep=best, ending=Ending.MEASURED, change=value, set_aside=aside)


def finish_of(verdict: Verdict, *, summary: Mapping[str, Any] | None = None,
              log_tail: str | None = None, run_ended_at: datetime | None = None,
              warnings: Sequence[str] = (), printed: float | None = None,
              best: float | None = None) -> Finish:
    """What is written with the experiment's end: the verdict's status, reason and record; its
    value the mean of the runs the record names (a crash with none: the metric its run printed,
    `printed`); the best then from the record; `best`: a keep's new best (agent.engine.
    incumbent works it out)."""
    assert verdict.status is not None and verdict.ending is not None
    metric = verdict.metric
    if metric is None and verdict.status in (ExperimentStatus.CRASHED, ExperimentStatus.TIMEOUT):
        metric = printed
    return Finish(
        verdict.status, verdict.crash_kind, verdict.reason or None, metric=metric,
        best_before=verdict.best.mean if verdict.best is not None else None,
        summary=dict(summary or {}), log_tail=log_tail, run_ended_at=run_ended_at,
        warnings=tuple(warnings), crash_cause=verdict.crash_cause, record=verdict.record(),
        best=best if verdict.keep else None)
