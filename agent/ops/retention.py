"""Retention (`overnight gc`): storage that stays bounded over a year of nights.

An old finished experiment (discarded, crashed, timeout, …; kept ones too when asked) keeps
what a person or an agent reads later — its diff, metric, summary, the log tail stored at
finish, its commit and hidden git ref — and loses what only mattered while it ran: its log
files (the experiment's and its runs'), most of its loss curve (thinned to a few points that
keep its shape and its lowest loss) and any worktree a killed process left behind. Queued and
running experiments are never touched. Uses the Store and Repo ports and the files under the
work dir; no SQL (database sizes and VACUUM are db.maintenance's).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from agent.core.domain import FINISHED_STATUSES, Experiment, ExperimentStatus, Sweep, utcnow
from agent.core.errors import ConfigError, NotFoundError
from agent.core.ports import Pruned, Repo, Store
from runner.summary import ProgressPoint

logger = logging.getLogger(__name__)
LOSS_POINTS_KEPT = 64  # per pruned curve: enough for its shape on a plot
BATCH = 200  # experiments pruned per transaction (their loss curves are read together)
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_WORKTREE = re.compile(r"^exp-(\d+)(?:-[a-z]+)?$")
PRUNED_LOG = ("[the full log was pruned by `overnight gc` on {at}; the last lines kept when "
              "the run finished follow]\n")


def parse_age(text: str) -> timedelta:
    """'7d', '12h', '2w', '90m', '30s' as a timedelta. ConfigError names a bad one."""
    m = _AGE.match(text or "")
    if not m:
        raise ConfigError(f"age {text!r}: use a number and a unit s, m, h, d or w (e.g. 7d)")
    return timedelta(seconds=float(m.group(1)) * _UNIT_S[m.group(2)])


def parse_statuses(text: str) -> frozenset[ExperimentStatus]:
    """'kept,crashed' (or 'none') as finished statuses. ConfigError names a bad one."""
    names = [n.strip() for n in (text or "").split(",") if n.strip() and n.strip() != "none"]
    allowed = sorted(s.value for s in FINISHED_STATUSES)
    bad = [n for n in names if n not in allowed]
    if bad:
        raise ConfigError(f"status {', '.join(bad)}: use finished statuses ({', '.join(allowed)})"
                          " or none")
    return frozenset(ExperimentStatus(n) for n in names)


@dataclass(frozen=True)
class RetentionPolicy:
    """What gc prunes: experiments finished more than `older_than` ago, except those whose
    status is in `keep_logs_of`; each pruned loss curve keeps `loss_points` points."""

    older_than: timedelta
    keep_logs_of: frozenset[ExperimentStatus] = frozenset({ExperimentStatus.KEPT})
    loss_points: int = LOSS_POINTS_KEPT

    @property
    def pruned_statuses(self) -> list[ExperimentStatus]:
        return sorted(FINISHED_STATUSES - self.keep_logs_of, key=lambda s: s.value)


@dataclass
class GcReport:
    """What gc removed (or, in a dry run, would remove)."""

    dry_run: bool
    experiments: int = 0
    log_files: int = 0
    log_bytes: int = 0
    loss_points_removed: int = 0
    worktrees: int = 0
    worktree_bytes: int = 0
    skipped: list[str] = field(default_factory=list)  # files left alone, and why


def pruned_log_note(exp: Experiment) -> str | None:
    """The line a log read starts with once gc removed the log file (None if it did not)."""
    if exp.pruned_at is None:
        return None
    return PRUNED_LOG.format(at=exp.pruned_at.strftime("%Y-%m-%d %H:%M UTC"))


def downsample(points: Sequence[ProgressPoint], keep: int) -> list[ProgressPoint]:
    """At most `keep` points: the lowest loss, the last, the first, then evenly spaced ones."""
    ordered = sorted(points, key=lambda p: p.step)
    n = len(ordered)
    if n <= keep:
        return ordered
    lowest = min(range(n), key=lambda i: ordered[i].loss)
    picks: set[int] = set()
    for i in [lowest, n - 1, 0] + [round(j * (n - 1) / max(keep - 1, 1)) for j in range(keep)]:
        if len(picks) >= keep:
            break
        picks.add(i)
    return [ordered[i] for i in sorted(picks)]


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except (OSError, ValueError):
        return False
    return True


def _log_files(exp: Experiment, run_logs: list[str], logs: Path,
               report: GcReport) -> list[tuple[Path, int]]:
    """The experiment's and its runs' log files that exist under `logs`, with their sizes.

    A recorded path outside the work dir's logs folder is left alone (a row is data: gc
    never deletes a file because a database says so, unless it is one of ours)."""
    paths = {exp.log_path, *run_logs}
    found = []
    for raw in sorted(p for p in paths if p):
        path = Path(raw)
        if path.is_symlink() or not _inside(path, logs):
            report.skipped.append(f"{raw}: not under {logs}")
            continue
        if path.is_file():
            found.append((path, path.stat().st_size))
    return found


def _prune_batch(store: Store, batch: list[Experiment], policy: RetentionPolicy, logs: Path,
                 report: GcReport) -> None:
    """Prune a batch: its runs' log paths and loss curves in two reads, the rows in one
    transaction, then the files."""
    ids = [e.id for e in batch]
    run_logs, curves = store.run_log_paths(ids), store.loss_curves(ids)
    pruned: dict[int, Pruned] = {}
    doomed: list[Path] = []
    for exp in batch:
        files = _log_files(exp, run_logs.get(exp.id, []), logs, report)
        points = curves[exp.id]
        kept = downsample(points, policy.loss_points)
        report.experiments += 1
        report.log_files += len(files)
        report.log_bytes += sum(size for _, size in files)
        report.loss_points_removed += len(points) - len(kept)
        pruned[exp.id] = (kept, {"log_files": len(files),
                                 "log_bytes": sum(size for _, size in files),
                                 "loss_points": [len(points), len(kept)]})
        doomed += [path for path, _ in files]
    if report.dry_run:
        return
    # The rows first: should a delete then fail, the record already says the log is gone
    # (and the log tail stays) rather than pointing at a half-deleted file.
    store.prune_experiments(pruned)
    for path in doomed:
        path.unlink(missing_ok=True)


def prune_experiments(store: Store, work_dir: Path, policy: RetentionPolicy, *,
                      now: datetime | None = None, dry_run: bool = False,
                      report: GcReport | None = None) -> GcReport:
    """Prune every experiment the policy names; the report of what went (or would go)."""
    report = report or GcReport(dry_run=dry_run)
    cutoff = (now or utcnow()) - policy.older_than
    logs = work_dir / "logs"
    after = 0
    while True:
        batch = store.prunable_experiments(cutoff, policy.pruned_statuses, BATCH,
                                           after_id=after)
        if not batch:
            return report
        _prune_batch(store, batch, policy, logs, report)
        after = batch[-1].id


def tree_bytes(root: Path) -> int:
    """Bytes of the files under `root`, symlinks not followed (a worktree links its assets)."""
    total = 0
    for folder, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


def _leftover_worktrees(work_dir: Path) -> Iterator[tuple[Path, int]]:
    """(folder, experiment id) of every worktree folder under work_dir/worktrees/<sweep>/."""
    root = work_dir / "worktrees"
    if not root.is_dir():
        return
    for sweep_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        for wt in sorted(sweep_dir.iterdir()):
            m = _WORKTREE.match(wt.name)
            if m and wt.is_dir() and not wt.is_symlink():
                yield wt, int(m.group(1))


def remove_worktrees(store: Store, repo_for: Callable[[Sweep], Repo], work_dir: Path,
                     cutoff: datetime, report: GcReport) -> None:
    """Remove worktrees a killed process left behind, of experiments finished before `cutoff`
    (never one of a queued or running experiment: its run may be using it)."""
    for wt, exp_id in _leftover_worktrees(work_dir):
        try:
            exp = store.get_experiment(exp_id)
        except NotFoundError:
            report.skipped.append(f"{wt}: no experiment {exp_id}")
            continue
        if not exp.status.is_finished() or not exp.finished_at or exp.finished_at >= cutoff:
            continue
        report.worktrees += 1
        report.worktree_bytes += tree_bytes(wt)
        if not report.dry_run:
            repo_for(store.get_sweep_by_id(exp.sweep_id)).remove_worktree(wt)


def collect_garbage(store: Store, repo_for: Callable[[Sweep], Repo], work_dir: Path,
                    policy: RetentionPolicy, *, now: datetime | None = None,
                    dry_run: bool = False) -> GcReport:
    """The whole gc but VACUUM: prune old experiments, remove their leftover worktrees."""
    now = now or utcnow()
    report = prune_experiments(store, work_dir, policy, now=now, dry_run=dry_run)
    remove_worktrees(store, repo_for, work_dir, now - policy.older_than, report)
    logger.info("gc%s: %d experiments, %d log files (%d bytes), %d loss points, %d worktrees",
                " (dry run)" if dry_run else "", report.experiments, report.log_files,
                report.log_bytes, report.loss_points_removed, report.worktrees)
    return report
