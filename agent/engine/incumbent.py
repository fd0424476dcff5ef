"""The best commit measured again now and then, beside a change when the keep rule asks, and the
lock a sweep's decisions take turns on.

A keep is decided on few runs, so the recorded best is noisy; once every `incumbent_every`
decided proposals (its runs beside changes count) a slot runs the best commit again before its
own change, and the best becomes the mean of its runs in its usual machine conditions (a re-run
whose throughput says the machine was in another condition is marked suspect and left out of
that mean; agent.rules.blocking). When the keep rule asks for it, the commit a change was built
on runs beside the change's latest run, with the seed the rule names, in the same slot (same
device): the same-window pair. Slots of one process each have their own Loop; the per-sweep
claim here makes slots finishing together run one re-run between them, and the decision lock
makes reading the best, recording a keep (or a new mean) and moving the branch one step.
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
from agent.engine.gather import GOOD, sample, sweep_speed_noise
from agent.ops.sweeps import link_assets
from agent.rules.conditions import conditions, usual_keys
from agent.rules.decide import Rule, incumbent_due
from agent.rules.noise import mean, speed_tolerance

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
            seed = rule.seed + len(mine)
            while seed in {r.seed for r in mine}:  # a seed it ran: its luck measured twice
                seed += 1
            run = self._run(sweep, exp, head, stop, RunSpec(
                sweep.id, current.best_experiment_id, head, seed, RunRole.INCUMBENT))
        if run.status is not RunStatus.OK or run.metric is None:
            return
        with decision_lock(sweep.branch, sweep.target_path):
            self.record_best(sweep, head)

    def record_best(self, sweep: Sweep, head: str) -> None:
        """The recorded best: the mean of the best commit's runs in its usual conditions, its
        other runs marked suspect (so the mean is that of its OK runs). Call under the
        decision lock."""
        current = self.store.get_sweep(sweep.name)
        if current.best_commit != head or current.best_experiment_id is None:
            return
        runs = self.store.run_metrics(sweep.id)
        good = [r for r in runs if r.commit == head and r.status in GOOD and r.metric is not None]
        rule = Rule.of(current.config)
        tol = rule.throughput_tolerance or speed_tolerance(
            sweep_speed_noise([r for r in runs if r.status in GOOD]))
        keys = conditions([sample(r) for r in good], tol)
        home = usual_keys(keys)
        usual = [r.metric for r, k in zip(good, keys, strict=True) if k == home.get(k[0])]
        for r, k in zip(good, keys, strict=True):
            want = RunStatus.OK if k == home.get(k[0]) else RunStatus.SUSPECT
            if r.status is not want:
                self.store.set_run_status(r.id, want)
        best = mean([m for m in usual if m is not None])
        if best is not None and best != current.best_metric:
            self.store.set_best(sweep.id, current.best_experiment_id, best, head,
                                baseline=current.best_experiment_id == self._baseline_id(sweep))

    def beside(self, sweep: Sweep, exp: Experiment, head: str, stop: threading.Event,
               seed: int, pair_of: int | None) -> Run:
        """Run the commit `exp` was built on beside its run `pair_of`, with `seed` (the keep
        rule's same-window pair), recorded under the experiment that made that commit."""
        spec = RunSpec(sweep.id, self._experiment_of(sweep, head), head, seed, RunRole.INCUMBENT,
                       pair_run_id=pair_of)
        return self._run(sweep, exp, head, stop, spec)

    def _experiment_of(self, sweep: Sweep, commit: str) -> int:
        current = self.store.get_sweep(sweep.name)
        if current.best_commit == commit and current.best_experiment_id is not None:
            return current.best_experiment_id
        for e in self.store.list_experiments(sweep.id, [ExperimentStatus.KEPT]):
            if e.commit == commit:
                return e.id
        raise LookupError(f"no kept experiment of sweep {sweep.name} made commit {commit[:7]}")

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
