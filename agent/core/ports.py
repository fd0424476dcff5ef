"""The loop's collaborators as Protocols: Store, Repo, Runner, Proposer, Clock.

Core modules depend on these, never on SQLAlchemy, git or subprocess directly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from agent.core.config import TargetConfig
from agent.core.diff import PathChange
from agent.core.domain import (
    CrashKind,
    Experiment,
    ExperimentStatus,
    Finish,
    Proposal,
    Run,
    RunEnd,
    RunSpec,
    RunStatus,
    Sweep,
    SweepStatus,
)
from runner.result import RunResult
from runner.summary import ProgressPoint


class Clock(Protocol):
    def now(self) -> datetime: ...


@dataclass(frozen=True)
class SweepSpec:
    name: str
    target_path: str
    branch: str
    proposer: str
    config: TargetConfig
    max_experiments: int | None = None
    deadline: datetime | None = None
    window: dict[str, str] | None = None
    protected_hashes: dict[str, str] = field(default_factory=dict)


# What `overnight gc` keeps of one experiment: the loss curve's kept points, and a note of
# what went (recorded as meta["pruned"]).
Pruned = tuple[Sequence[ProgressPoint], Mapping[str, Any]]


class Store(Protocol):
    """Persistent record of sweeps, experiments and loss points.

    Contract: every method is its own short transaction; a finished experiment is never
    modified (finish/transition on it raise ConflictError); claims are guarded updates so two
    workers never run the same experiment. Unknown ids/names raise NotFoundError.
    """

    def reading(self) -> AbstractContextManager[None]:
        """A block whose reads share one transaction (one consistent view, one connection);
        for reads only."""

    def create_sweep(self, spec: SweepSpec) -> Sweep:
        """Raises ConflictError if the name is taken."""

    def get_sweep(self, name: str) -> Sweep:
        """Raises NotFoundError."""

    def get_sweep_by_id(self, sweep_id: int) -> Sweep: ...

    def list_sweeps(self, statuses: Collection[SweepStatus] | None = None) -> list[Sweep]:
        """Every sweep (or those in `statuses`), oldest first."""

    def set_sweep_status(self, name: str, status: SweepStatus) -> Sweep: ...

    def set_start_at(self, name: str, when: datetime | None) -> Sweep:
        """Record (or clear, with None) a paused sweep's timed start."""

    def set_best(
        self, sweep_id: int, experiment_id: int, metric: float, commit: str, baseline: bool
    ) -> None:
        """Record a new best (and the baseline metric when `baseline`)."""

    def add_experiment(
        self,
        sweep_id: int,
        proposal: Proposal,
        *,
        ended: Finish | None = None,
        is_baseline: bool = False,
        attempt: int = 0,
        priority: int = 0,
        base_commit: str | None = None,
        retry_of: int | None = None,
    ) -> Experiment:
        """Insert a queued experiment, or one born finished with `ended` (a refusal, the crash
        cap's verdict: agent.rules.endings.finish_of; agent.core.domain.born builds the row).
        With `retry_of`, the row re-runs that interrupted experiment; ConflictError if it
        already has a retry.

        Raises DuplicateError when a queued or running experiment of the sweep already has the
        same normalized diff (checked by the insert itself, so concurrent callers cannot both
        pass); NotFoundError for an unknown sweep."""

    def get_experiment(self, experiment_id: int) -> Experiment: ...

    def list_experiments(
        self,
        sweep_id: int | None = None,
        statuses: Sequence[ExperimentStatus] | None = None,
        limit: int | None = None,
        newest_first: bool = False,
        before_id: int | None = None,
        crash_kind: CrashKind | None = None,
        after_id: int | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[Experiment]:
        """Experiments matching every given filter, by id (descending with `newest_first`),
        at most `limit`: a keyset page. `before_id`/`after_id` keep ids below/above them (the
        cursor); a page's cost must not grow with the rows outside it.

        `since`/`until` (aware datetimes) keep experiments created in [since, until): the
        time a row was written (queued, or refused at once). That is when it entered the
        listing, in the listing's id order, so a window is one stretch of the pages and a
        cursor walk inside it stays in it; every row has it (a queued or refused one has no
        finish time)."""

    def count_experiments(
        self,
        sweep_id: int | None = None,
        statuses: Sequence[ExperimentStatus] | None = None,
        crash_kind: CrashKind | None = None,
        is_baseline: bool | None = None,
    ) -> int:
        """How many experiments match; every filter is optional (None = any). Exact, and
        cheap without `is_baseline` (a store keeps counts per sweep, status and crash kind)."""

    def retry_of(self, experiment_id: int) -> Experiment | None:
        """The row re-queued for an interrupted experiment, if any."""

    def request_cancel(self, experiment_id: int, reason: str) -> bool:
        """Record, durably, that a running experiment is to be cancelled; False when it is
        not running. A dead process's row then ends cancelled, not interrupted."""

    def interrupt_running(self) -> list[Experiment]:
        """Mark every `running` experiment `interrupted` (left by a dead process), or
        `cancelled` (domain.reaped_end) where a cancel had been requested."""

    def claim_next(self, sweep_id: int | None = None) -> Experiment | None:
        """Move the next queued experiment (priority, then FIFO) to running and return it."""

    def claim(self, experiment_id: int) -> Experiment | None:
        """Guarded queued → running for one experiment; None if it was not queued."""

    def mark_started(
        self,
        experiment_id: int,
        *,
        commit: str | None = None,
        ref: str | None = None,
        base_commit: str | None = None,
        log_path: str | None = None,
        pgid: int | None = None,
        run_started_at: datetime | None = None,
    ) -> None:
        """Fill run details on a running experiment."""

    def finish(
        self, experiment_id: int, finish: Finish, keep_commit: str | None = None
    ) -> Experiment:
        """Move a queued/running experiment to a finished status. ConflictError if finished.

        With `keep_commit`, the sweep's best (and baseline, for the baseline) becomes that
        commit with `finish.best` as its value, in the same transaction (ValueError without
        one)."""

    def run_metrics(self, sweep_id: int, after_id: int | None = None,
                    ids: Collection[int] = ()) -> list[Run]:
        """The sweep's runs by id with id, experiment_id, commit, seed, role, status, metric,
        throughput, throughput_source, device, pair_run_id and note set (no summary, times or
        log): what the sweep's evidence and each keep decision need, cheap for a long sweep.
        `after_id` and `ids` as in experiment_marks."""

    def has_diff(self, sweep_id: int, diff: str) -> Experiment | None:
        """An earlier non-rejected experiment of the sweep with the same normalized diff."""

    def protected_hashes(self, sweep_id: int) -> dict[str, str]: ...

    def add_llm_usage(self, sweep_id: int, experiment_id: int | None, tokens_in: int,
                      tokens_out: int, usd: float) -> None:
        """Add language-model spend to the sweep's counters (and the experiment's, if given)."""

    def llm_usage(self, sweep_id: int) -> tuple[int, int, float]:
        """The sweep's (tokens in, tokens out, dollars) so far."""

    def add_loss_points(self, experiment_id: int, points: Sequence[ProgressPoint]) -> None: ...

    def replace_loss_points(self, experiment_id: int, points: Sequence[ProgressPoint]) -> None:
        """Make `points` the experiment's whole loss curve (after downsampling)."""

    def loss_curves(self, experiment_ids: Collection[int]) -> dict[int, list[ProgressPoint]]:
        """loss_points of many experiments in one read (each id present; [] for none)."""

    def prunable_experiments(self, finished_before: datetime,
                             statuses: Sequence[ExperimentStatus], limit: int,
                             after_id: int = 0) -> list[Experiment]:
        """`overnight gc`'s candidates: experiments in `statuses` (finished ones only) that
        finished before `finished_before` and were never pruned, with ids above `after_id`;
        by id, at most `limit`."""

    def prune_experiments(self, pruned: Mapping[int, Pruned]) -> None:
        """`overnight gc`, in one transaction for all of `pruned` (experiment id → its kept
        points and note): make the points each loss curve, forget the log files (the
        experiments' and their runs' `log_path` become None), stamp `pruned_at`, and record
        the note as meta["pruned"]. Diff, metric, summary, log tail, commit and ref stay.

        Raises NotFoundError; ConflictError unless every experiment is finished (then nothing
        is pruned)."""

    def start_run(self, spec: RunSpec) -> Run:
        """Record a run as `running` before its process starts. NotFoundError: no experiment."""

    def set_run_pgid(self, run_id: int, pgid: int) -> None:
        """Record the process group of a started run (at spawn, so recovery can kill it)."""

    def set_run_job(self, run_id: int, job_id: str) -> None:
        """Record the Slurm job running a run (at submission, or when a restart adopts the
        job). NotFoundError: no such run."""

    def end_run(self, run_id: int, end: RunEnd) -> Run:
        """Record how a running run ended. Raises ConflictError if it had already ended."""

    def set_run_status(self, run_id: int, status: RunStatus, note: str | None = None) -> None:
        """Flip an ended run between ok and suspect, with the keep rule's `note` on how it was
        placed (None leaves the note as it was). ConflictError for any other change."""

    def list_runs(self, sweep_id: int | None = None, experiment_id: int | None = None) -> list[Run]:
        """Runs oldest first, of one sweep and/or one experiment (None = any)."""

    def run_log_paths(self, experiment_ids: Collection[int]) -> dict[int, list[str]]:
        """The recorded log paths of these experiments' runs, by experiment (ids without any
        are left out)."""

    def interrupt_running_runs(self) -> list[Run]:
        """Mark every `running` run `interrupted` and return them (with their pgids)."""


class Repo(Protocol):
    """The target's git repository. Never moves the user's own branches or checkout."""

    def head(self, ref: str) -> str: ...

    def has_ref(self, ref: str) -> bool: ...

    def uncommitted(self) -> list[tuple[str, str]]:
        """(status code, path) of each uncommitted change in the user's checkout."""

    def ensure_branch(self, branch: str, start: str = "HEAD") -> str:
        """Create `branch` at `start` if missing; return its sha."""

    def check_applies(self, base: str, diff: str) -> str | None:
        """None if `diff` applies cleanly on `base`, else git's message."""

    def tree_changes(self, base: str, diff: str) -> list[PathChange]:
        """What applying `diff` on `base` would change, as git reports it (no ref moves).

        Raises PatchError (git's message) when the diff does not apply."""

    def commit_proposal(self, base: str, diff: str, message: str) -> tuple[str, list[PathChange]]:
        """Commit `diff` on `base` without touching any worktree: (the commit, what it changes
        against `base`, as git reports it). Raises PatchError (git's message) when the diff
        does not apply."""

    def set_ref(self, ref: str, sha: str) -> None: ...

    def advance_branch(self, branch: str, sha: str, expected_old: str) -> None:
        """Move `branch` to `sha` only if it still points at `expected_old`."""

    def add_worktree(self, path: Path, sha: str) -> None: ...

    def remove_worktree(self, path: Path) -> None: ...

    def prune_worktrees(self, ours: Path | None = None) -> None:
        """Drop the entries of worktrees that are gone; with `ours`, also the locked entries
        of worktrees that lay below it (half created by a process that died)."""

    def read_file(self, sha: str, path: str) -> str: ...

    def file_hashes(self, sha: str, paths: Sequence[str]) -> dict[str, str]: ...

    def log(self, branch: str, limit: int = 100) -> list[tuple[str, str]]:
        """(short sha, subject) newest first."""

    def remove_stale_ref_locks(self, prefixes: Sequence[str]) -> list[Path]:
        """Delete `<ref>.lock` files under these ref folders (a kill mid-update); the paths."""


class Runner(Protocol):
    def run(
        self,
        argv: list[str],
        *,
        cwd: Path,
        log_path: Path,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        on_start: Callable[[int, int], None] | None = None,
        on_line: Callable[[str], None] | None = None,
        stop_event: threading.Event | None = None,
        on_submit: Callable[[str], None] | None = None,
    ) -> RunResult:
        """Run `argv` as a guest: allow-listed environment plus `pass_env` names, then `env`.

        `on_start(pid, pgid)` is called when a local process group exists (never for a remote
        run); `on_submit(job_id)` when a batch scheduler (Slurm) has the run as a job.

        Raises WorkerLostError (a remote runner only) when the machine running it went away
        before reporting a result; RunNotStartedError, before the command starts, when the
        executor cannot start it (a refused job, no node that fits, no GPU where one is asked
        for). A run that started always returns a RunResult.
        """


@dataclass(frozen=True)
class ProposalContext:
    """What a proposer may look at: the target, the current best files and the history."""

    sweep: Sweep
    files: dict[str, str]  # editable path -> content at the sweep head
    history: list[Experiment]  # oldest first, this sweep only
    program: str = ""  # the target's program.md, if any
    llm_tokens: int = 0  # tokens (in + out) language models spent on this sweep so far
    llm_usd: float = 0.0  # and their estimated dollars


class Proposer(Protocol):
    name: str
    # Why the last propose() returned None, when the proposer can say (e.g. "no knobs in
    # train.py"); the engine records it as a rejected row so a sweep never ends silently.
    out_of_ideas: str | None

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        """The next one-change proposal, or None when out of ideas."""

    def repair(self, ctx: ProposalContext, failed: Experiment) -> Proposal | None:
        """A fixed diff for a trivially crashed experiment, or None to give up."""
