"""What a slot may take from a sweep's queue, read and claimed through the store alone.

Used by agent.engine.scheduler under its pick lock. Guaranteed: until a sweep's baseline is
kept only the baseline is claimed; a sweep at its max_experiments claims only continuations
(re-queued on a new head, repairs of trivial crashes: CONTINUATION_PRIORITY and above); a sweep
is marked done only when none of its runs is in flight.
"""

from __future__ import annotations

import logging

from agent.core.domain import (
    CONTINUATION_PRIORITY,
    USED_STATUSES,
    Experiment,
    ExperimentStatus,
    Sweep,
    SweepStatus,
)
from agent.core.ports import Store
from agent.rules.gate import SweepFacts

logger = logging.getLogger(__name__)


def sweep_facts(store: Store, sweep: Sweep) -> SweepFacts:
    """What gate() needs, read from the store (the one definition of "used")."""
    count = store.count_experiments
    return SweepFacts(
        status=sweep.status, max_experiments=sweep.max_experiments, deadline=sweep.deadline,
        window=sweep.window, used=count(sweep.id, USED_STATUSES, is_baseline=False),
        running=count(sweep.id, [ExperimentStatus.RUNNING]),
        baseline_kept=sweep.baseline_metric is not None,
    )


def continuations(store: Store, sweep: Sweep) -> list[Experiment]:
    """Queued experiments that continue one already counted (re-queued on a new head,
    repairs), highest priority first: a sweep at its max still runs them."""
    queued = store.list_experiments(sweep.id, [ExperimentStatus.QUEUED])
    continuing = [e for e in queued if not e.is_baseline and e.priority >= CONTINUATION_PRIORITY]
    return sorted(continuing, key=lambda e: (-e.priority, e.id))


def claim_continuation(store: Store, sweep: Sweep) -> Experiment | None:
    for exp in continuations(store, sweep):
        claimed = store.claim(exp.id)
        if claimed is not None:
            return claimed
    return None


def claim_queued(store: Store, sweep: Sweep) -> Experiment | None:
    """Priority then FIFO; but until the baseline is kept, only the baseline may run."""
    if sweep.baseline_metric is not None:
        return store.claim_next(sweep.id)
    queued = store.list_experiments(sweep.id, [ExperimentStatus.QUEUED])
    baseline = next((e for e in queued if e.is_baseline), None)
    if baseline is None and store.get_sweep(sweep.name).baseline_metric is not None:
        return store.claim_next(sweep.id)  # `sweep` was read before the baseline ended
    if baseline is None and store.count_experiments(
            sweep.id, [ExperimentStatus.RUNNING], is_baseline=True):
        return None  # another slot claimed it after `sweep` was read
    if baseline is None:  # nothing of the sweep runs and no baseline is left: it is lost
        logger.error("sweep %s has no baseline to run (cancelled or given up); stopping it",
                     sweep.name)
        store.set_sweep_status(sweep.name, SweepStatus.STOPPED)
        return None
    return store.claim(baseline.id)


def finish_sweep(store: Store, sweep: Sweep, reason: str) -> None:
    """Mark the sweep done, unless a run of it is in flight (it finishes first: it may still
    be kept)."""
    if store.count_experiments(sweep.id, [ExperimentStatus.RUNNING]):
        return
    logger.info("sweep %s done: %s", sweep.name, reason)
    store.set_sweep_status(sweep.name, SweepStatus.DONE)
