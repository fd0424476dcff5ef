"""The service layer: what the REST routes, the MCP tools and the CLI do to sweeps and experiments.

Queue a proposal, cancel an experiment, read a log, read a sweep's rules and results, count what
a sweep has used, change a sweep's status — one implementation for every caller. Uses the Store
and Repo ports only (no SQL, no HTTP, no MCP); errors are agent.core.errors exceptions that each
adapter maps to its own answer (an HTTP status, a tool error, a CLI message).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.analysis.evidence import SweepEvidence, sweep_evidence
from agent.analysis.report import results_tsv
from agent.core.domain import (
    USED_STATUSES,
    Experiment,
    ExperimentStatus,
    Proposal,
    Sweep,
    SweepStatus,
)
from agent.core.errors import ConflictError
from agent.core.ports import Repo, Store
from agent.ops.admission import place, queue, screen
from agent.ops.retention import pruned_log_note
from agent.rules.endings import cancelled, finish_of
from agent.rules.holdout import redact
from runner.logtail import read_log_end

logger = logging.getLogger(__name__)
LOG_READ_LIMIT = 4 * 1024 * 1024  # bytes of a log read at once (its tail)

StopRunning = Callable[[int], bool]  # ask the engine to stop a running experiment


@dataclass(frozen=True)
class Usage:
    """How much of its `max_experiments` a sweep has used (the baseline never counts)."""

    used: int  # ran or was refused: kept, discarded, crashed, timeout, rejected, running
    queued: int
    max_experiments: int | None

    @property
    def left(self) -> int | None:
        """Proposals the sweep still accepts (queued ones already hold a place)."""
        if self.max_experiments is None:
            return None
        return max(self.max_experiments - self.used - self.queued, 0)


def holdout_key(store: Store, exp: Experiment) -> str | None:
    """The sealed holdout metric of the experiment's sweep (None: its target names none)."""
    return store.get_sweep_by_id(exp.sweep_id).config.holdout_metric


def read_log(exp: Experiment, tail_lines: int | None = None,
             max_bytes: int = LOG_READ_LIMIT, sealed: str | None = None) -> str:
    """The run's log (its last `max_bytes`), else the tail stored at finish (after a line
    saying so once `overnight gc` pruned the log); with `tail_lines`, only that many last
    lines (falling back to the reason when there is no log). `sealed`: the holdout metric,
    whose value never shows (a run still writing its log has not been sealed yet)."""
    text = ""
    if exp.log_path and Path(exp.log_path).is_file():
        text = redact(read_log_end(Path(exp.log_path), max_bytes), sealed)
    note = pruned_log_note(exp) if not text else None
    text = text or exp.log_tail or ""
    if note and tail_lines is None:
        return note + text
    if tail_lines is None:
        return text
    return "\n".join((text or exp.reason or "").splitlines()[-tail_lines:])


class Service:
    """Sweep and experiment operations over a Store and the targets' repositories.

    `stop_running` asks whoever executes experiments in this process (the engine) to stop a
    running one; without it only queued experiments can be cancelled.
    """

    def __init__(self, store: Store, repo_for: Callable[[Sweep], Repo],
                 stop_running: StopRunning | None = None) -> None:
        self.store, self.repo_for, self.stop_running = store, repo_for, stop_running

    # --- reading --------------------------------------------------------------------------
    def usage(self, sweep: Sweep) -> Usage:
        count = self.store.count_experiments
        return Usage(used=count(sweep.id, USED_STATUSES, is_baseline=False),
                     queued=count(sweep.id, [ExperimentStatus.QUEUED], is_baseline=False),
                     max_experiments=sweep.max_experiments)

    def best_files(self, sweep: Sweep, commit: str | None = None) -> tuple[str, dict[str, str]]:
        """(commit, {editable path: content}) at `commit`, default the sweep branch's head."""
        repo = self.repo_for(sweep)
        commit = commit or repo.head(sweep.branch)
        editable = sweep.config.editable
        return commit, {p: repo.read_file(commit, p) for p in editable}

    def evidence(self, sweep: Sweep) -> SweepEvidence:
        """Each experiment's mean ± CI, n and P(better); σ̂ and the honest statement."""
        runs = self.store.list_runs(sweep_id=sweep.id)
        return sweep_evidence(sweep, self.store.list_experiments(sweep.id), runs)

    def results_tsv(self, sweep: Sweep, full: bool = False) -> str:
        """autoresearch's results.tsv; `full` adds n, sd, P(better) and the runs, and each
        `[target] secondary` key's mean and n (as `overnight results --format tsv-full`)."""
        exps = self.store.list_experiments(sweep.id)
        runs = self.store.list_runs(sweep_id=sweep.id) if full and sweep.config.secondary \
            else None
        return results_tsv(sweep, exps, self.evidence(sweep) if full else None, runs)

    # --- acting ---------------------------------------------------------------------------
    def queue(self, sweep_name: str, proposal: Proposal, priority: int = 0) -> Experiment:
        """Admit and queue one proposal; a refusal raises and writes nothing. The reads before
        git (the sweep, its usage, the duplicate lookup) share one transaction; git runs
        outside any, and the insert has its own."""
        with self.store.reading():
            sweep = self.store.get_sweep(sweep_name)
            if sweep.status.is_finished():
                raise ConflictError(f"sweep {sweep.name} is {sweep.status.value}: it takes no "
                                    "more experiments")
            if sweep.max_experiments is not None:  # no cap: nothing to count (the cheap path)
                usage = self.usage(sweep)
                if usage.left == 0:
                    raise ConflictError(f"sweep {sweep.name} reached max_experiments="
                                        f"{sweep.max_experiments} ({usage.used} used, "
                                        f"{usage.queued} queued)")
            screened = screen(self.store, sweep, proposal)
        return queue(self.store, place(self.repo_for(sweep), sweep, screened), priority=priority)

    def set_status(self, sweep_name: str, new: SweepStatus) -> Sweep:
        sweep = self.store.get_sweep(sweep_name)
        if sweep.status.is_finished():
            raise ConflictError(f"sweep {sweep_name} is {sweep.status.value}; it cannot be "
                                "changed")
        return self.store.set_sweep_status(sweep_name, new)

    def cancel(self, experiment_id: int, reason: str = "cancelled by request"
               ) -> tuple[Experiment, bool]:
        """Cancel a queued experiment now, or ask a running one to stop.

        Returns (experiment, pending): pending is True when a running experiment was asked to
        stop and will be recorded `cancelled` shortly. Raises NotFoundError, ConflictError.
        """
        exp = self.store.get_experiment(experiment_id)
        if exp.status.is_finished():
            raise ConflictError(f"experiment {exp.id} is already {exp.status.value}; finished "
                                "records cannot be changed")
        # Claim first (a guarded update) so no slot can start it while we cancel it.
        if exp.status is ExperimentStatus.QUEUED and self.store.claim(exp.id) is not None:
            return self.store.finish(exp.id, finish_of(cancelled(reason))), False
        if self.stop_running is not None and self.stop_running(exp.id):
            # Durable before the answer: a service that dies before the run stops still ends
            # it cancelled on restart (recovery), never re-queued.
            self.store.request_cancel(exp.id, reason)
            return self.store.get_experiment(exp.id), True
        exp = self.store.get_experiment(experiment_id)
        if exp.status.is_finished():
            raise ConflictError(f"experiment {exp.id} is already {exp.status.value}")
        raise ConflictError(f"experiment {exp.id} is running in the service, not in this "
                            "process; stop it through the service that runs it (HTTP API or "
                            "its /mcp endpoint)")
