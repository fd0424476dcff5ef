"""The best commit measured again now and then, and the lock a sweep's decisions take turns on.

A keep is decided on few runs, so the recorded best is noisy; once every `incumbent_every`
decided proposals a slot runs the best commit again before its own change, and the best becomes
the mean of all the best commit's runs (a re-run whose throughput is off is marked suspect and
left out). Slots of one process each have their own Loop; the per-sweep claim here makes slots
finishing together run one re-run between them, and the decision lock makes reading the best,
recording a keep (or a new mean) and moving the branch one step.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agent.core.domain import Experiment, ExperimentStatus, Run, RunRole, RunSpec, RunStatus, Sweep
from agent.core.ports import Repo, Store
from agent.engine.attempt import LoopSettings, TrainingRuns
from agent.ops.sweeps import link_assets
from agent.rules.decide import Rule, incumbent_due
from agent.rules.noise import mean, suspect_flags

_DECISION_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_DECISION_LOCKS_GUARD = threading.Lock()


def decision_lock(branch: str, target: str) -> threading.Lock:
    """The lock decisions on one sweep (target, branch) of this process take turns on."""
    with _DECISION_LOCKS_GUARD:
        return _DECISION_LOCKS.setdefault((target, branch), threading.Lock())


# Incumbent re-runs a slot of this process has decided on but whose run may not be recorded
# yet, per sweep (target, branch): slots finishing together would otherwise all see the same
# re-run as due.
_INCUMBENT_CLAIMS: Counter[tuple[str, str]] = Counter()
_INCUMBENT_GUARD = threading.Lock()


@contextmanager
def _incumbent_claim(sweep: Sweep, decided: int, recorded: int, rule: Rule) -> Iterator[bool]:
    """Whether this slot re-runs the incumbent now (held for the re-run's length): due counting
    the re-runs recorded and those other slots have claimed. While a claimed re-run is also
    recorded it counts twice, which can only put the next re-run off, never double one."""
    key = (sweep.target_path, sweep.branch)
    with _INCUMBENT_GUARD:
        mine = incumbent_due(decided, recorded + _INCUMBENT_CLAIMS[key], rule)
        if mine:
            _INCUMBENT_CLAIMS[key] += 1
    try:
        yield mine
    finally:
        if mine:
            with _INCUMBENT_GUARD:
                _INCUMBENT_CLAIMS[key] -= 1


class Incumbent:
    """Re-runs of a sweep's best commit, for one Loop (its store, repo and training runs)."""

    def __init__(self, store: Store, repo: Repo, settings: LoopSettings,
                 training: TrainingRuns) -> None:
        self.store, self.repo, self.settings, self.training = store, repo, settings, training

    def remeasure(self, sweep: Sweep, exp: Experiment, head: str, stop: threading.Event) -> None:
        """Once every `incumbent_every` proposals, run the best commit again before a change, so
        the recorded best (the mean of all its runs) converges to its true value."""
        current = self.store.get_sweep(sweep.name)
        rule = Rule.of(current.config)
        if exp.is_baseline or current.best_commit != head or current.best_experiment_id is None:
            return
        runs = self.store.run_metrics(sweep.id)
        decided = self.store.count_experiments(
            sweep.id, [ExperimentStatus.KEPT, ExperimentStatus.DISCARDED], is_baseline=False
        )
        done = sum(r.role is RunRole.INCUMBENT for r in runs)
        with _incumbent_claim(sweep, decided, done, rule) as due:
            if not due:
                return
            mine = [r for r in runs if r.commit == head]
            run = self._run(sweep, exp, head, stop, RunSpec(
                sweep.id, current.best_experiment_id, head, rule.seed + len(mine),
                RunRole.INCUMBENT))
        ok = [r for r in mine if r.status is RunStatus.OK and r.metric is not None]
        if run.status is not RunStatus.OK or run.metric is None:
            return
        flags = suspect_flags(
            [run.throughput], [r.throughput for r in ok], rule.throughput_tolerance
        )
        if flags[0]:
            self.store.set_run_status(run.id, RunStatus.SUSPECT)
            return
        best = mean([r.metric for r in ok if r.metric is not None] + [run.metric])
        with decision_lock(sweep.branch, sweep.target_path):
            if best is not None and self.store.get_sweep(sweep.name).best_commit == head:
                self.store.set_best(
                    sweep.id,
                    current.best_experiment_id,
                    best,
                    head,
                    baseline=current.best_experiment_id == self._baseline_id(sweep),
                )

    def _run(self, sweep: Sweep, exp: Experiment, head: str, stop: threading.Event,
             spec: RunSpec) -> Run:
        wt = self.settings.work_dir / "worktrees" / sweep.name / f"exp-{exp.id}-incumbent"
        self.repo.add_worktree(wt, head)
        try:
            link_assets(wt, Path(sweep.target_path), sweep.config)
            return self.training.run(sweep, exp, wt, stop, spec)[2]
        finally:
            self.repo.remove_worktree(wt)

    def _baseline_id(self, sweep: Sweep) -> int | None:
        first = self.store.list_experiments(sweep.id, limit=1)
        return first[0].id if first and first[0].is_baseline else None
