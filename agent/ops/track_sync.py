"""One sweep brought up to date in one tracker, synchronously: what the mirror's thread does
after each event and what `overnight export` does once.

The ledger (db.track_marks) says what the tracker already holds: the sweep's parent run and
each experiment's child run with the verdict it was sent. A sync opens the parent run if it
has none, logs every finished experiment it lacks, in id order, marking each once the tracker
has it (so a sync stopped half-way, by a failure or a kill, goes on where it stopped and
never logs one twice), and once the sweep is finished sends the verdicts that moved since
(a verdict's interval and P(better) move as the incumbent is re-measured), then the sweep's
own numbers, and closes the parent. Every tracker call goes through `call` (the retries).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

from agent.analysis.evidence import sweep_evidence
from agent.core.domain import Experiment, Sweep
from agent.core.ports import Store
from agent.ops.track_record import (
    ExperimentRecord,
    SweepRecord,
    experiment_record,
    sweep_record,
    verdict,
)

Call = Callable[[Callable[[], object]], object]  # a tracker call, with the retries
Light = Callable[[Sweep], list[Experiment]]  # a sweep's experiments without diffs or logs


class TrackerError(Exception):
    """A tracker call that failed; `retry`: worth trying again (the tracker is down or slow,
    not refusing what it was sent)."""

    def __init__(self, why: str, retry: bool = True) -> None:
        super().__init__(why)
        self.retry = retry


class Tracker(Protocol):
    """An experiment tracker (agent.ops.track_mlflow, agent.ops.track_wandb). Each call is
    idempotent for the same record: a call tried again finds what the first one made."""

    destination: str  # which tracker, where (no secret): the ledger's key

    def check(self) -> None:
        """Reach the tracker; TrackerError naming the problem if it cannot be reached."""

    def open_sweep(self, rec: SweepRecord) -> str:
        """The sweep's parent run (made, or found and reopened): its id."""

    def log_experiment(self, parent: str, rec: ExperimentRecord) -> str:
        """One experiment as a child run of `parent`, finished: its id."""

    def update_verdict(self, parent: str, remote_id: str, experiment_id: int,
                       numbers: dict[str, float]) -> None:
        """The child run's verdict numbers set to `numbers`."""

    def close_sweep(self, parent: str, rec: SweepRecord) -> None:
        """The sweep's numbers on the parent run, and the parent ended."""

    def close(self) -> None:
        """Let go of what is open (the process ends)."""


@dataclass(frozen=True)
class Mirrored:
    """What the ledger says a tracker holds of one sweep."""

    parent: str | None = None
    closed: bool = False
    experiments: dict[int, tuple[str, dict[str, float]]] = field(default_factory=dict)


class TrackLedger(Protocol):
    def mirrored(self, sweep_id: int, destination: str) -> Mirrored: ...

    def follow(self, sweep_id: int, destination: str) -> None:
        """The tracker is to hold the sweep (before its first call: a slow tracker shows
        behind from the start)."""

    def mark_sweep(self, sweep_id: int, destination: str, remote_id: str,
                   closed: bool) -> None:
        """The parent run is there (and ended when `closed`); clears the error."""

    def mark_experiment(self, sweep_id: int, destination: str, experiment_id: int,
                        remote_id: str, sent: dict[str, float]) -> None:
        """The experiment's child run is there with the verdict `sent`."""

    def failed(self, sweep_id: int, destination: str, error: str) -> None:
        """The last sync stopped on `error` (the dashboard shows the tracker behind)."""


@dataclass
class SyncReport:
    logged: int = 0
    updated: int = 0
    closed: bool = False


def sync_sweep(sweep: Sweep, tracker: Tracker, ledger: TrackLedger, store: Store, *,
               light: Light, base_url: str, call: Call) -> SyncReport:
    """Bring `tracker` up to date with `sweep` (see the module docstring)."""
    dest, out = tracker.destination, SyncReport()
    marks = ledger.mirrored(sweep.id, dest)
    exps = light(sweep)
    finished = [e for e in exps if e.status.is_finished()]
    pending = [e for e in finished if e.id not in marks.experiments]
    ending = sweep.status.is_finished()
    if marks.parent is not None and not pending and (marks.closed or not ending):
        return out
    if marks.parent is None:
        ledger.follow(sweep.id, dest)
    ev = sweep_evidence(sweep, exps, store.run_metrics(sweep.id))
    parent = marks.parent
    if parent is None or (marks.closed and pending):
        rec = sweep_record(sweep, ev, base_url)
        parent = str(call(partial(tracker.open_sweep, rec)))
        ledger.mark_sweep(sweep.id, dest, parent, closed=False)
    for e in pending:
        full = store.get_experiment(e.id)
        one = experiment_record(sweep, full, store.list_runs(experiment_id=e.id),
                                ev.experiments.get(e.id), base_url)
        remote = str(call(partial(tracker.log_experiment, parent, one)))
        ledger.mark_experiment(sweep.id, dest, e.id, remote, one.verdict)
        out.logged += 1
    if not ending:
        return out
    for e in finished:
        if e.id not in marks.experiments:
            continue
        remote, sent = marks.experiments[e.id]
        now = verdict(sweep, e, ev.experiments.get(e.id))
        if now != sent:
            call(partial(tracker.update_verdict, parent, remote, e.id, now))
            ledger.mark_experiment(sweep.id, dest, e.id, remote, now)
            out.updated += 1
    final = sweep_record(sweep, ev, base_url)
    call(partial(tracker.close_sweep, parent, final))
    ledger.mark_sweep(sweep.id, dest, parent, closed=True)
    out.closed = True
    return out

