"""The best commit measured again now and then, paired with a change's run when the keep rule
asks, and the lock a sweep's decisions take turns on.

Every `incumbent_every` decided proposals a slot runs the best commit again before its own change
(agent.rules.decide.incumbent_due: the paired runs count), so the reference follows a machine
that drifts. The recorded best is the mean of the best commit's runs in its most common speed
group (agent.rules.placement.usual_runs, the keep rule's own definition); a run of it at another
speed is marked suspect. When the keep rule asks, the commit a change was built on runs paired
with the change's latest run, with the seed the rule names, in the same slot (same
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
from agent.engine.gather import noise_parts
from agent.ops.sweeps import link_assets
from agent.rules.decide import Rule, incumbent_due, next_seed
from agent.rules.run_records import recorded_best

_DECISION_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_DECISION_LOCKS_GUARD = threading.Lock()


def decision_lock(branch: str, target: str) -> threading.Lock:
    """The lock decisions on one sweep (target, branch) of this process take turns on."""
    with _DECISION_LOCKS_GUARD:
        return _DECISION_LOCKS.setdefault((target, branch), threading.Lock())


# Incumbent re-runs a slot of this process has decided on but whose run may not be recorded
# yet, per sweep (target, branch): slots finishing together would otherwise all see the same
# re-run as due.
_CLAIMED_RERUNS: Counter[tuple[str, str]] = Counter()
_CLAIMED_RERUNS_LOCK = threading.Lock()


@contextmanager
def _claim_rerun_if_due(sweep: Sweep, decided: int, recorded: int, rule: Rule,
                        noise_measured: bool) -> Iterator[bool]:
    """Whether this slot re-runs the incumbent now (claimed for the re-run's length): due
    counting the re-runs recorded and those other slots have claimed (as runs of the best too).
    While a claimed re-run is also recorded it counts twice, which can only delay the next
    re-run, never double one."""
    key = (sweep.target_path, sweep.branch)
    with _CLAIMED_RERUNS_LOCK:
        claimed = _CLAIMED_RERUNS[key]
        rerun_now = incumbent_due(decided, recorded + claimed, rule, noise_measured)
        if rerun_now:
            _CLAIMED_RERUNS[key] += 1
    try:
        yield rerun_now
    finally:
        if rerun_now:
            with _CLAIMED_RERUNS_LOCK:
                _CLAIMED_RERUNS[key] -= 1


class Incumbent:
    """Re-runs of a sweep's best commit, for one Loop (its store, repo and training runs)."""

    def __init__(self, store: Store, repo: Repo, settings: LoopSettings,
                 training: TrainingRuns) -> None:
        self.store, self.repo, self.settings, self.training = store, repo, settings, training

    def remeasure(self, sweep: Sweep, exp: Experiment, head: str, stop: threading.Event) -> None:
        """Run the best commit again before a change when agent.rules.decide.incumbent_due
        says so (once every `incumbent_every` proposals, while the noise is measured)."""
        current = self.store.get_sweep(sweep.name)
        rule = Rule.of(current.config)
        if exp.is_baseline or current.best_commit != head or current.best_experiment_id is None:
            return
        runs = self.store.run_metrics(sweep.id)
        decided = self.store.count_experiments(
            sweep.id, [ExperimentStatus.KEPT, ExperimentStatus.DISCARDED], is_baseline=False
        )
        reruns = sum(r.role is RunRole.INCUMBENT for r in runs)
        noise_measured = noise_parts(runs, time_budget=rule.time_budget)[1] > 0
        with _claim_rerun_if_due(sweep, decided, reruns, rule, noise_measured) as due:
            if not due:
                return
            best_id = current.best_experiment_id
            seed = next_seed({r.seed for r in self.store.list_runs(experiment_id=best_id)
                              if r.commit == head}, rule)
            run = self._run(sweep, exp, head, stop, RunSpec(
                sweep.id, current.best_experiment_id, head, seed, RunRole.INCUMBENT))
        if run.status is not RunStatus.OK or run.metric is None:
            return
        with decision_lock(sweep.branch, sweep.target_path):
            self.record_best(sweep, head)

    def value_of(self, sweep: Sweep, commit: str) -> float | None:
        """The value `commit` has as the best: the keep rule's one value of a commit (agent.
        rules.placement.usual_runs: the mean of its good runs in its usual machine condition).
        A keep writes it with the verdict; `record_best` writes it again as re-runs come."""
        return recorded_best(self.store.run_metrics(sweep.id), commit,
                             time_budget=sweep.config.time_budget)[0]

    def record_best(self, sweep: Sweep, head: str) -> None:
        """The recorded best, the one writer of its value after a keep: `value_of` the best
        commit. Each re-run of it (role incumbent) is OK in its usual condition, else suspect
        (this is the only writer of their status; its own runs keep what its verdict gave them:
        a finished record is never edited). Call under the decision lock, after every
        decision."""
        current = self.store.get_sweep(sweep.name)
        if current.best_commit != head or current.best_experiment_id is None:
            return
        best, good_runs, outside_common_speed = recorded_best(
            self.store.run_metrics(sweep.id), head, time_budget=sweep.config.time_budget)
        for run, outside in zip(good_runs, outside_common_speed, strict=True):
            want = RunStatus.SUSPECT if outside else RunStatus.OK
            if run.role is RunRole.INCUMBENT and run.status is not want:
                self.store.set_run_status(run.id, want)
        if best is not None and best != current.best_metric:
            self.store.set_best(sweep.id, current.best_experiment_id, best, head,
                                baseline=current.best_experiment_id == self._baseline_id(sweep))

    def run_paired(self, sweep: Sweep, exp: Experiment, head: str, stop: threading.Event,
                   seed: int, pair_of: int | None) -> Run:
        """Run the commit `exp` was built on paired with its run `pair_of`, with `seed` (the keep
        rule's same-window pair), recorded under the experiment that made that commit. The
        rule sees only the commit's good runs: a seed one of its runs started with and never
        finished (a kill, a crash) is not run again; the next free one is."""
        kept_id = self._kept_experiment_of(sweep, head)
        started = {r.seed for r in self.store.list_runs(experiment_id=kept_id)
                   if r.commit == head}
        seed = next_seed(started, Rule.of(sweep.config), prefer=seed)
        spec = RunSpec(sweep.id, kept_id, head, seed, RunRole.INCUMBENT, pair_run_id=pair_of)
        return self._run(sweep, exp, head, stop, spec)

    def _kept_experiment_of(self, sweep: Sweep, commit: str) -> int:
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
