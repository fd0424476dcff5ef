"""The loop of an ablation sweep (`overnight finalize --ablate`) and of a confirmation sweep
(`overnight confirm`, agent.ops.confirm: its one variant is the night's baseline): each
variant's commit run k times, the same seeds for every variant, recorded as runs; no keep
rule, nothing moves.

The engine's slots run it like any sweep (the composition root hands the scheduler this loop
for a sweep whose proposer is "ablation:<sweep>"): claim → worktree → k runs → record. Its
baseline is the best (every kept change), recorded kept so the slots' baseline-first rule holds;
the variants (the baseline, the best minus each kept change) are recorded discarded with the
mean of their runs: measured, never the sweep's head. A failed run ends its variant (crashed or
timeout, classified as any run is), a stop ends it cancelled, a run the executor could not start
ends it not started (queued again).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from agent.core.domain import Experiment, Run, RunRole, RunSpec, RunStatus, Sweep, utcnow
from agent.core.errors import RunNotStartedError, interrupt_reason
from agent.core.ports import Repo, Runner, Store
from agent.engine.attempt import EventFn, LoopSettings, TrainingRuns, emit_to
from agent.engine.recovery import requeue_once
from agent.git.repo import hash_worktree_files
from agent.ops.sweeps import link_assets
from agent.rules.classify import CrashFacts
from agent.rules.decide import Evidence, Rule, RunFailure, Verdict, decide
from agent.rules.endings import (
    cancelled,
    finish_of,
    interrupted,
    measured_variant,
    not_started,
    refused,
)
from agent.rules.run_records import runs_tolerance, sample
from runner.result import Outcome, RunResult

logger = logging.getLogger(__name__)


class AblationLoop:
    """One slot's loop for an ablation sweep: what SlotScheduler calls on a Loop."""

    proposer = None  # nothing is proposed: the variants were queued by finalize

    def __init__(self, store: Store, repo: Repo, runner: Runner, settings: LoopSettings,
                 on_event: EventFn | None = None) -> None:
        self.store, self.repo, self.settings, self.on_event = store, repo, settings, on_event
        self.training = TrainingRuns(store, runner, settings, self.emit)
        self._stops: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def emit(self, kind: str, exp: Experiment, data: dict[str, Any] | None = None) -> None:
        emit_to(self.on_event, kind, exp, data)

    def propose(self, sweep: Sweep) -> Experiment | None:
        return None

    def cancel(self, experiment_id: int) -> bool:
        with self._lock:
            ev = self._stops.get(experiment_id)
        if ev is None:
            return False
        ev.set()
        return True

    def execute(self, sweep: Sweep, exp: Experiment,
                stop: threading.Event | None = None) -> Experiment:
        """Run a claimed variant to a finished record."""
        stop = stop if stop is not None else threading.Event()
        with self._lock:
            self._stops[exp.id] = stop
        wt = self.settings.work_dir / "worktrees" / sweep.name / f"exp-{exp.id}"
        added_worktree = False
        try:
            commit = self._variant_commit(sweep, exp)
            if isinstance(commit, Experiment):
                return commit
            if stop.is_set():
                return self._end(exp, cancelled("cancelled before it started"))
            self.repo.add_worktree(wt, commit)
            added_worktree = True
            link_assets(wt, Path(sweep.target_path), sweep.config)
            return self._measure(sweep, exp, commit, wt, stop)
        except RunNotStartedError as exc:  # queued again; the engine pauses the sweep
            done = self._end(exp, not_started(str(exc)[:500]))
            retry = requeue_once(self.store, done)
            if retry is not None:
                self.emit("queued", retry)
            return done
        except BaseException as exc:
            self._record_failure(exp, exc)
            raise
        finally:
            with self._lock:
                self._stops.pop(exp.id, None)
            if added_worktree:
                self.repo.remove_worktree(wt)

    def _variant_commit(self, sweep: Sweep, exp: Experiment) -> str | Experiment:
        """The variant's commit, its ref set and its start recorded; a rejected record if its
        commit is missing or its protected files differ from the sweep's."""
        variant = exp.meta.get("ablation") or exp.meta.get("confirm")  # what it runs, either way
        commit = exp.base_commit if exp.is_baseline else (
            variant.get("commit") if isinstance(variant, dict) else None)
        if not commit or not self.repo.has_ref(str(commit)):
            return self._end(exp, refused(f"ablation variant without a commit: {commit}"))
        commit = str(commit)
        ref = f"refs/overnight/{sweep.name}/{exp.id}"
        self.repo.set_ref(ref, commit)
        expected = self.store.protected_hashes(sweep.id)
        actual = self.repo.file_hashes(commit, sweep.config.protected)
        changed = sorted(p for p in sweep.config.protected if actual.get(p) != expected.get(p))
        if changed:
            return self._end(exp, refused(f"protected file(s) differ: {', '.join(changed)}"))
        self.store.mark_started(exp.id, commit=commit, ref=ref, base_commit=exp.base_commit)
        return commit

    def _measure(self, sweep: Sweep, exp: Experiment, commit: str, wt: Path,
                 stop: threading.Event) -> Experiment:
        config = sweep.config
        runs: list[Run] = []
        result: RunResult | None = None
        for k in range(config.baseline_runs):
            role = RunRole.BASELINE if exp.is_baseline else (
                RunRole.SCREEN if k == 0 else RunRole.CONFIRM)
            spec = RunSpec(sweep.id, exp.id, commit, config.seed + k, role)
            result, started, run = self.training.run(sweep, exp, wt, stop, spec)
            failed = self._failed(sweep, wt, result, started, run, runs)
            if failed is not None:
                return self._end(exp, failed, log_tail=result.log_tail)
            runs.append(run)
        assert result is not None
        what = "the best (every kept change)" if exp.is_baseline else exp.description
        kind = "confirm" if isinstance(exp.meta.get("confirm"), dict) else "ablation"
        tolerance = runs_tolerance(self.store.run_metrics(sweep.id), sweep.config.time_budget)
        verdict = measured_variant([sample(r) for r in runs], tolerance, kind, what,
                                   best=exp.is_baseline)
        return self._end(exp, verdict, summary=result.summary, log_tail=result.log_tail,
                         keep_commit=commit if exp.is_baseline else None,
                         best=verdict.metric if exp.is_baseline else None)

    def _failed(self, sweep: Sweep, wt: Path, result: RunResult, started: bool, run: Run,
                before: list[Run]) -> Verdict | None:
        """How the variant ends when its latest run gave no usable metric (None: it did): the
        keep rule's own verdict on a failed run (agent.rules.decide)."""
        failure: RunFailure | None = None
        expected = self.store.protected_hashes(sweep.id)
        watched = [*sweep.config.protected, *sweep.config.assets]
        actual = hash_worktree_files(wt, watched)
        tampered = sorted(p for p in watched if p in expected and actual.get(p) != expected[p])
        if result.outcome is Outcome.STOPPED:
            failure = RunFailure(stopped=True)
        elif tampered:
            failure = RunFailure(tampered=tuple(tampered))
        elif run.status is not RunStatus.OK:
            failure = RunFailure(facts=CrashFacts(
                timed_out=result.outcome is Outcome.TIMED_OUT, fail_marker=result.fail_marker,
                exit_code=result.exit_code,
                signal=result.signal if result.outcome is Outcome.SIGNALED else None,
                error=result.error, log_tail=result.log_tail, training_started=started,
                has_metric=False), error=result.error or result.outcome.value)
        if failure is None:
            return None
        # a variant is a commit measured k times: any failed run ends it as the first would
        return decide(Evidence(is_baseline=False, runs=(), failed=failure), Rule())

    def _end(self, exp: Experiment, verdict: Verdict, *, keep_commit: str | None = None,
             summary: dict[str, Any] | None = None, log_tail: str | None = None,
             best: float | None = None) -> Experiment:
        """The one place this loop writes a variant's end (agent.rules.endings.finish_of)."""
        done = self.store.finish(exp.id, finish_of(
            verdict, summary=summary, log_tail=log_tail, run_ended_at=utcnow(), best=best),
            keep_commit=keep_commit)
        self.emit("finished", done)
        return done

    def _record_failure(self, exp: Experiment, exc: BaseException) -> None:
        """An unexpected error (or Ctrl-C): never leave the row `running`."""
        try:
            if self.store.get_experiment(exp.id).status.is_finished():
                return
            asked = isinstance(exc, KeyboardInterrupt)
            reason = (interrupt_reason(exc) if isinstance(exc, KeyboardInterrupt)
                      else f"service error: {exc!r}"[:500])
            self.store.finish(exp.id, finish_of(interrupted(reason, on_purpose=asked)))
        except Exception:
            logger.exception("could not record the failure of experiment %s", exp.id)
