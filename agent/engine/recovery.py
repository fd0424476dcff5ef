"""Restart recovery and the single-instance lock: make a restart after a crash lose nothing.

On start, before any slot runs: experiments left `running` by a dead process become
`interrupted` and are re-queued once as new linked rows; their orphaned process groups are
killed, and so is every process whose environment carries one of their run ids (found by
OVERNIGHT_RUN_ID wherever it moved: setsid, chdir, double fork; a Slurm job's runs carry it
prefixed, and are left to Slurm: their retries adopt them, agent.executors.slurm); leftover
worktrees (but those such a job still runs in) and ref locks are pruned; each sweep branch is
reset to the database's best commit if the two disagree (the database is the source of truth:
a keep is recorded before the branch moves).
Idempotent: a recovery killed half-way is completed by the next one.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from agent.core.domain import (
    Experiment,
    ExperimentStatus,
    Proposal,
    Run,
    RunStatus,
    Sweep,
    SweepStatus,
)
from agent.core.errors import ConflictError
from agent.core.ports import Repo, Store
from agent.core.private import private_file
from agent.core.record import Ending
from agent.engine.attempt import run_id_prefix, stop_point
from agent.rules.endings import (
    MAX_CRASH_RETRIES,
    finish_of,
    gave_up,
    on_purpose,
    stopped_before_restart,
)

logger = logging.getLogger(__name__)

# An interrupted run whose reason is this was stopped by a clean shutdown; such interruptions
# do not count towards the crash cap (agent.rules.endings.gave_up).
SHUTDOWN_REASON = "the service shut down while this experiment was running"
# The refs the service writes (a kill during `git update-ref` can leave their `.lock` behind).
SERVICE_REFS = ("refs/heads/overnight", "refs/overnight")


class InstanceLockError(RuntimeError):
    """Another `overnight serve` holds the database."""


class DatabaseLock(Protocol):
    """What the engine needs of an instance lock: one executing process per database, held
    for the process's life. InstanceLock here (a file beside SQLite), db.lock.AdvisoryLock on
    PostgreSQL."""

    @property
    def held(self) -> bool: ...

    def release(self) -> None: ...


class InstanceLock:
    """An exclusive flock on `<db>.lock`, held for the life of the service.

    The kernel drops it when the process dies (kill -9 included), so it is never stale.
    """

    def __init__(self, db_path: Path) -> None:
        self.path = Path(str(Path(db_path).expanduser().resolve()) + ".lock")
        self._fh: IO[str] | None = None

    def acquire(self) -> InstanceLock:
        private_file(self.path)
        fh = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held until release()
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise InstanceLockError(
                f"another overnight process (serve, run or mcp --run; pid {holder}) is already "
                f"using this database (lock {self.path}); queue work through it, stop it first, "
                "or use another --db") from None
        try:  # who holds it, for a second process's message; a full disk leaves it unsaid
            os.ftruncate(fh.fileno(), 0)
            os.pwrite(fh.fileno(), f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            logger.warning("cannot write the pid into %s: %s", self.path, exc)
        self._fh = fh
        return self

    @property
    def held(self) -> bool:
        return self._fh is not None

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


@dataclass
class RecoveryReport:
    interrupted: list[int] = field(default_factory=list)  # rows found `running`
    requeued: dict[int, int] = field(default_factory=dict)  # interrupted id -> retry id
    not_requeued: list[int] = field(default_factory=list)  # given up after MAX_CRASH_RETRIES
    paused: dict[str, str] = field(default_factory=dict)  # sweep -> why (its baseline)
    killed_groups: list[int] = field(default_factory=list)
    killed_pids: list[int] = field(default_factory=list)  # found by their run id
    repaired_branches: dict[str, tuple[str, str]] = field(default_factory=dict)  # (was, now)
    removed_worktrees: list[str] = field(default_factory=list)


def _is_our_group(pgid: int, work_dir: Path) -> bool:
    """Guard against a reused pgid: the leader (if alive) must be running in our work_dir.

    A pid equal to a live group's id cannot be handed out again, so a group whose leader has
    exited but which still has members is still ours.
    """
    try:
        cwd = os.readlink(f"/proc/{pgid}/cwd")
    except FileNotFoundError:
        return True  # leader gone (members may remain) or no such process
    except OSError:
        return True  # no /proc (not Linux) or not allowed: trust the record
    return cwd.startswith(str(work_dir.resolve()))


def kill_orphan_groups(exps: list[Experiment], work_dir: Path,
                       kill: Callable[[int], bool]) -> list[int]:
    killed = []
    for exp in exps:
        if exp.pgid and _is_our_group(exp.pgid, work_dir) and kill(exp.pgid):
            logger.warning("killed orphaned process group %d of experiment %d", exp.pgid, exp.id)
            killed.append(exp.pgid)
    return killed


def kill_run_id_carriers(exps: list[Experiment], work_dir: Path,
                         kill: Callable[[str], list[int]]) -> list[int]:
    """Kill every process carrying the run id of an interrupted experiment (any of its runs)."""
    killed: list[int] = []
    for exp in exps:
        found = kill(run_id_prefix(work_dir, exp.id))
        if found:
            logger.warning("killed %d orphaned process(es) of experiment %d: %s", len(found),
                           exp.id, found)
        killed += found
    return killed


def kill_orphan_runs(runs: list[Run], work_dir: Path, kill: Callable[[int], bool]) -> list[int]:
    killed = []
    for run in runs:
        if run.pgid and _is_our_group(run.pgid, work_dir) and kill(run.pgid):
            logger.warning("killed orphaned process group %d of run %d (experiment %d, %s)",
                           run.pgid, run.id, run.experiment_id, run.role.value)
            killed.append(run.pgid)
    return killed


def requeue_interrupted(store: Store, report: RecoveryReport) -> None:
    """Re-queue every interrupted experiment once, as a new row linked to it.

    Each interrupted row gets at most one retry row (retry_of = its id), so recovery is
    idempotent; it scans all interrupted rows (not only those reaped now) so a recovery that
    died between reaping and re-queueing is completed here. A chain of retries is cut after
    MAX_CRASH_RETRIES crash interruptions (meta `crash_retries` counts them).
    """
    sweeps: dict[int, Sweep] = {s.id: s for s in store.list_sweeps()}
    for exp in store.list_experiments(statuses=[ExperimentStatus.INTERRUPTED]):
        sweep = sweeps.get(exp.sweep_id)
        if sweep is None or sweep.status.is_finished():
            continue
        if store.retry_of(exp.id) is not None:
            continue
        follow_up = requeue_once(store, exp)
        if follow_up is None:
            continue
        if follow_up.status.is_finished():  # its verdict: given up, or stopped early before
            report.not_requeued.append(exp.id)
            continue
        report.requeued[exp.id] = follow_up.id
        why = baseline_pause_reason(follow_up)
        if why is not None and sweep.status is SweepStatus.RUNNING:
            store.set_sweep_status(sweep.name, SweepStatus.PAUSED)
            report.paused[sweep.name] = why
            logger.error("sweep %s paused: %s", sweep.name, why)


def ran_when_interrupted(store: Store, exp: Experiment) -> bool:
    """Was its code running when the service went (a run of it was cut off), rather than
    the service dying around a row that had not started anything yet?"""
    return any(r.status is RunStatus.INTERRUPTED for r in store.list_runs(experiment_id=exp.id))


def baseline_pause_reason(retry: Experiment) -> str | None:
    """Why a re-queued baseline's sweep must pause (it kept taking the service down), or None."""
    n = int(retry.meta.get("crash_retries", 0))
    if not retry.is_baseline or n <= MAX_CRASH_RETRIES:
        return None
    return (f"its baseline's run was cut off each of the {n} times the service or its worker "
            "died; it is queued again: look at the machine and the target (memory, disk, the "
            "service's log), then resume the sweep")


def requeue_once(store: Store, exp: Experiment) -> Experiment | None:
    """The one follow-up of an interrupted (or not started) experiment, a new row linked by
    retry_of: its retry, or, once its code was running each of more than MAX_CRASH_RETRIES
    service deaths, its verdict (agent.rules.endings.gave_up). A baseline is always queued
    again. Only interruptions while its code ran count; a clean stop, Ctrl-C/SIGTERM or a run
    the executor never started does not.

    Returns None when the experiment already has its follow-up (the store refuses a second:
    ConflictError), so two callers can never queue it twice.
    """
    pruned = next((r for r in store.list_runs(experiment_id=exp.id)
                   if r.status is RunStatus.PRUNED), None)
    if pruned is not None and not exp.is_baseline:  # it ended before the service did
        return _pruned_follow_up(store, exp, pruned)
    counts_as_crash = not on_purpose(exp.record) and ran_when_interrupted(store, exp)
    crashes = int(exp.meta.get("crash_retries", 0)) + counts_as_crash
    proposal = Proposal(exp.description, exp.diff, exp.proposer, parent_id=exp.id,
                        meta={**exp.meta, "retry_of": exp.id, "crash_retries": crashes})
    given_up = None if exp.is_baseline else gave_up(crashes)
    try:
        follow_up = store.add_experiment(
            exp.sweep_id, proposal, is_baseline=exp.is_baseline, attempt=exp.attempt,
            priority=exp.priority, base_commit=exp.base_commit, retry_of=exp.id,
            ended=finish_of(given_up) if given_up is not None else None)
    except ConflictError:
        return None  # followed up already (by another caller)
    if given_up is not None:
        logger.error("experiment %d: its run was cut off each of the %d times the service or "
                     "its worker died; recorded as crashed (%d)", exp.id, crashes, follow_up.id)
    else:
        ended = exp.record.ending if exp.record is not None else None
        logger.log(logging.INFO if ended is Ending.NOT_STARTED else logging.WARNING,
                   "re-queued %s experiment %d as %d", ended.value if ended else "interrupted",
                   exp.id, follow_up.id)
    return follow_up


def _pruned_follow_up(store: Store, exp: Experiment, run: Run) -> Experiment | None:
    """An experiment whose run had been stopped early (a finished run) when the service went:
    its follow-up is its verdict, `discarded` with the stop's reason, never another run."""
    proposal = Proposal(exp.description, exp.diff, exp.proposer, parent_id=exp.id,
                        meta={**exp.meta, "retry_of": exp.id})
    try:
        follow_up = store.add_experiment(
            exp.sweep_id, proposal, attempt=exp.attempt, priority=exp.priority,
            base_commit=exp.base_commit, retry_of=exp.id,
            ended=finish_of(stopped_before_restart(run.note, stop_point(run))))
    except ConflictError:
        return None
    logger.warning("experiment %d: its run %d had been stopped early; recorded as discarded "
                   "(%d)", exp.id, run.id, follow_up.id)
    return follow_up


def prune_worktrees(repos: list[Repo], work_dir: Path, report: RecoveryReport,
                    keep: Collection[Path] = ()) -> None:
    """Nothing runs here yet, so every worktree under work_dir is left over, but those in `keep`
    (a Slurm job that outlived the service runs in it)."""
    root = work_dir / "worktrees"
    kept = {Path(p).resolve() for p in keep}
    if root.is_dir():
        for sweep_dir in root.iterdir():
            for wt in (sweep_dir.iterdir() if sweep_dir.is_dir() else []):
                if wt.resolve() in kept:
                    continue
                shutil.rmtree(wt, ignore_errors=True)
                report.removed_worktrees.append(str(wt))
    for repo in repos:
        try:
            repo.prune_worktrees(root)
        except Exception as exc:
            logger.warning("git worktree prune failed: %s", exc)


def repair_branch(repo: Repo, sweep: Sweep, report: RecoveryReport) -> None:
    if not sweep.best_commit:
        return
    try:
        head = repo.head(sweep.branch)
    except Exception:
        head = ""
    if head != sweep.best_commit:
        repo.set_ref(f"refs/heads/{sweep.branch}", sweep.best_commit)
        report.repaired_branches[sweep.name] = (head, sweep.best_commit)
        logger.warning("sweep %s: branch %s was at %s, reset to the recorded best %s",
                       sweep.name, sweep.branch, head[:7] or "(missing)", sweep.best_commit[:7])


def _open_target(repos: dict[str, Repo | Exception], sweep: Sweep,
                 repo_for: Callable[[Sweep], Repo]) -> Repo | None:
    """The sweep's target repository, opened (and its stale ref locks removed) once per target;
    None if it cannot be opened: an error for a sweep that may still run, while a year of done
    nights whose target was deleted is not a year of errors."""
    if sweep.target_path not in repos:
        try:
            repos[sweep.target_path] = repo = repo_for(sweep)
        except Exception as exc:
            repos[sweep.target_path] = exc
        else:
            for lock in repo.remove_stale_ref_locks(SERVICE_REFS):
                logger.warning("removed stale ref lock %s", lock)
    found = repos[sweep.target_path]
    if isinstance(found, Exception):
        log = logger.info if sweep.status is SweepStatus.DONE else logger.error
        log("sweep %s: cannot open target %s: %s", sweep.name, sweep.target_path, found)
        return None
    return found


def _kill_by_run_id_prefix(prefix: str) -> list[int]:
    from runner.tree import kill_by_run_id

    return kill_by_run_id(prefix, prefix=True)


def recover(store: Store, repo_for: Callable[[Sweep], Repo], work_dir: Path,
            kill: Callable[[int], bool] | None = None,
            kill_run: Callable[[str], list[int]] = _kill_by_run_id_prefix,
            keep_worktrees: Collection[Path] = ()) -> RecoveryReport:
    """Run every recovery step; a target that cannot be opened is logged and skipped.
    `keep_worktrees`: worktrees a job still uses (a Slurm job that outlived the service)."""
    if kill is None:
        from runner.groups import kill_process_group

        kill = kill_process_group
    report = RecoveryReport()
    reaped = store.interrupt_running()
    report.interrupted = [e.id for e in reaped]
    report.killed_groups = kill_orphan_groups(reaped, work_dir, kill)
    report.killed_pids = kill_run_id_carriers(reaped, work_dir, kill_run)
    # confirmation and incumbent runs have their own process groups, recorded at spawn
    runs = store.interrupt_running_runs()
    known = set(report.killed_groups)
    report.killed_groups += kill_orphan_runs([r for r in runs if r.pgid not in known],
                                             work_dir, kill)
    repos: dict[str, Repo | Exception] = {}
    for sweep in store.list_sweeps():
        repo = _open_target(repos, sweep, repo_for)
        # A done sweep ran nothing when it ended (the engine marks it done only then), so no
        # keep can be half-recorded: its branch is its owner's now and is never reset.
        if repo is not None and sweep.status is not SweepStatus.DONE:
            repair_branch(repo, sweep, report)
    prune_worktrees([r for r in repos.values() if not isinstance(r, Exception)], work_dir,
                    report, keep_worktrees)
    requeue_interrupted(store, report)
    return report
