"""What the keep rule sees of a sweep, read from the store, and each run's status written back.

The change's good runs and its incumbent's (the runs of the commit it was built on, those
started paired with it included) as agent.rules.placement Samples; the other commits' good
runs, per machine condition, as σ̂'s prior; the night's earlier tests (for the
false-discovery-rate level); after the verdict, each run's status (ok or suspect) and the
rule's note on how it was placed. Talks to the Store port only.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace

from agent.core.domain import Experiment, ExperimentStatus, Run, RunRole, RunStatus
from agent.core.ports import Store
from agent.rules.decide import Verdict
from agent.rules.noise import speed_noise, speed_tolerance
from agent.rules.placement import Sample, noise_part
from agent.rules.run_records import USABLE, runs_tolerance, sample

__all__ = ["USABLE", "GatheredRuns", "earlier_tests", "gather", "noise_parts", "sample",
           "sweep_speed_noise", "write_run_statuses"]


@dataclass(frozen=True)
class GatheredRuns:
    change_runs: list[Run]  # the change's good runs, oldest first
    incumbent_runs: list[Run]  # its incumbent's (none for a baseline)
    others: tuple[float, int]  # noise_parts of the other commits
    speed_noise: float | None  # noise.speed_noise of the sweep's good runs
    incumbent_seeds: frozenset[int]  # seeds the incumbent's runs started with, finished or not


def gather(store: Store, sweep_id: int, exp: Experiment, head: str, commit: str,
           time_budget: bool = True, keys: Sequence[str] = ()) -> GatheredRuns:
    """`keys`: summary-block keys the rule's bounds read; the runs then carry their summaries
    (a fuller read, only when a target has [target.constraints])."""
    every = store.run_metrics(sweep_id)
    if keys:
        summaries = {r.id: r.summary for r in store.list_runs(sweep_id)}
        every = [replace(r, summary=summaries.get(r.id) or {}) for r in every]
    runs = [r for r in every if r.metric is not None]
    good = [r for r in runs if r.status in USABLE]
    change_runs = [r for r in good
                   if r.experiment_id == exp.id and r.role is not RunRole.INCUMBENT]
    incumbent_runs = [] if exp.is_baseline else [r for r in good if r.commit == head]
    seeds = frozenset(r.seed for r in every if r.commit == head and r.seed is not None)
    speed = sweep_speed_noise(good)  # measured once: the rule's and σ̂'s tolerance
    return GatheredRuns(change_runs, incumbent_runs,
                        noise_parts(good, (head, commit), speed_tolerance(speed, time_budget)),
                        speed, seeds)


def noise_parts(runs: Sequence[Run], leave_out: Collection[str | None] = (),
                tolerance: float | None = None, time_budget: bool = True) -> tuple[float, int]:
    """σ̂'s parts from the good runs of every commit but `leave_out`: each one's runs per
    machine condition (agent.rules.placement.noise_part), at the sweep's speed tolerance (worked
    out from `runs` unless given)."""
    commits: dict[str | None, list[Sample]] = {}
    for r in runs:
        if r.status in USABLE and r.metric is not None and r.commit not in leave_out:
            commits.setdefault(r.commit, []).append(sample(r))
    tol = runs_tolerance(runs, time_budget) if tolerance is None else tolerance
    parts = [noise_part(c, tol) for c in commits.values()]
    return sum(ss for ss, _ in parts), sum(df for _, df in parts)


def earlier_tests(store: Store, sweep_id: int) -> tuple[tuple[float, bool], ...]:
    """The night's tests so far, (p-value, kept), in the order they were decided."""
    done = [(e, e.record.p) for e in store.list_experiments(
        sweep_id, [ExperimentStatus.KEPT, ExperimentStatus.DISCARDED])
        if e.record is not None and e.record.p is not None]
    done.sort(key=lambda d: (d[0].finished_at is None, d[0].finished_at, d[0].id))
    return tuple((p, e.status is ExperimentStatus.KEPT) for e, p in done)


def sweep_speed_noise(runs: Sequence[Run]) -> float | None:
    """The run-to-run σ of log throughput of these runs (in start order)."""
    return speed_noise([(r.commit, r.device, r.throughput) for r in runs])


def write_run_statuses(store: Store, change_runs: Sequence[Run], incumbent_runs: Sequence[Run],
                       verdict: Verdict) -> None:
    """Each run's status and note as the verdict placed it, where they changed: the change's
    runs; of the incumbent's re-runs only the note (their status is the recorded best's,
    agent.engine.incumbent.record_best; its own runs keep what its verdict gave them: a
    finished record is never edited)."""
    _write_statuses(store, zip(change_runs, verdict.suspect, verdict.notes, strict=False))
    _write_statuses(store, ((r, r.status is RunStatus.SUSPECT, n) for r, n in
                            zip(incumbent_runs, verdict.best_notes, strict=False)
                            if r.role is RunRole.INCUMBENT))


def _write_statuses(store: Store, rows: Iterable[tuple[Run, bool, str]]) -> None:
    for run, suspect, note in rows:
        want = RunStatus.SUSPECT if suspect else RunStatus.OK
        if run.status is not want or (note or None) != run.note:
            store.set_run_status(run.id, want, note)
