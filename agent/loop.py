"""One experiment at a time: claim → commit → worktree → run → classify → decide → record.

The core of the product. Talks to git, the database, the runner and the proposer only through
the ports in agent.ports. Every run's outcome is recorded; only unexpected errors re-raise.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.admit import check_changes
from agent.classify import CrashFacts, classify
from agent.config import TargetConfig
from agent.decide import is_improvement
from agent.domain import (
    CrashKind,
    Experiment,
    ExperimentStatus,
    Finish,
    Proposal,
    Sweep,
    utcnow,
)
from agent.errors import AdmissionError
from agent.gitrepo import hash_worktree_files
from agent.ports import Proposer, Repo, Runner, Store
from agent.sweeps import link_assets, proposal_context, submit
from agent.training import EventFn, LoopSettings, TrainingRuns
from runner.result import Outcome, RunResult

logger = logging.getLogger(__name__)
REPAIR_PRIORITY = 50
MAX_REJECTED_IN_A_ROW = 5


_DECISION_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_DECISION_LOCKS_GUARD = threading.Lock()


def _decision_lock(branch: str, target: str) -> threading.Lock:
    with _DECISION_LOCKS_GUARD:
        return _DECISION_LOCKS.setdefault((target, branch), threading.Lock())


class Loop:
    def __init__(
        self,
        store: Store,
        repo: Repo,
        runner: Runner,
        settings: LoopSettings,
        proposer: Proposer | None = None,
        on_event: EventFn | None = None,
    ) -> None:
        self.store, self.repo, self.runner = store, repo, runner
        self.settings, self.proposer = settings, proposer
        self.on_event = on_event
        self.training = TrainingRuns(store, runner, settings, self.emit)
        self._stops: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def emit(self, kind: str, exp: Experiment, data: dict[str, Any] | None = None) -> None:
        if self.on_event is not None:
            try:
                self.on_event(kind, exp, data or {})
            except Exception:  # a display problem must never stop the night
                logger.exception("event handler failed for %s", kind)

    # --- asking the proposer -------------------------------------------------------------
    def propose(self, sweep: Sweep) -> Experiment | None:
        """Ask the proposer for the next change and queue it; None when it has no more.

        A refused proposal is recorded `rejected`; a few in a row are tolerated, then the
        proposer counts as out of ideas. Claiming (and the sweep's limits) is the engine's job.
        """
        if self.proposer is None:
            return None
        for _ in range(MAX_REJECTED_IN_A_ROW):
            proposal = self.proposer.propose(proposal_context(self.store, self.repo, sweep))
            if proposal is None:
                self._record_out_of_ideas(sweep)
                return None
            queued = submit(self.store, self.repo, sweep, proposal, record_rejection=True)
            if queued.status is ExperimentStatus.QUEUED:
                return queued
            self.emit("finished", queued)
        logger.warning("sweep %s: %d proposals in a row were refused; the proposer is out of "
                       "ideas", sweep.name, MAX_REJECTED_IN_A_ROW)
        return None

    def _record_out_of_ideas(self, sweep: Sweep) -> None:
        """A proposer that can say why it has nothing (e.g. no knobs in the target) gets that
        reason recorded as a rejected row, so the sweep does not end in a silent `done`."""
        why = getattr(self.proposer, "out_of_ideas", None)
        if not why or self.proposer is None:
            return
        logger.warning("sweep %s: %s", sweep.name, why)
        row = self.store.add_experiment(
            sweep.id, Proposal("the proposer has nothing to propose", "", self.proposer.name),
            status=ExperimentStatus.REJECTED, reason=why)
        self.emit("finished", row)

    def cancel(self, experiment_id: int) -> bool:
        """Ask a running experiment to stop; it is recorded as cancelled. False if not here."""
        with self._lock:
            ev = self._stops.get(experiment_id)
        if ev is None:
            return False
        ev.set()
        return True

    # --- one experiment -----------------------------------------------------------------
    def execute(self, sweep: Sweep, exp: Experiment) -> Experiment:
        """Run a claimed (running) experiment to a finished record. Never leaves it running."""
        wt = self.settings.work_dir / "worktrees" / sweep.name / f"exp-{exp.id}"
        stop = threading.Event()
        with self._lock:
            self._stops[exp.id] = stop
        added_worktree = False
        try:
            prepared = self._prepare(sweep, exp)
            if isinstance(prepared, Experiment):
                return prepared
            head, commit = prepared
            self.repo.add_worktree(wt, commit)
            added_worktree = True
            link_assets(wt, Path(sweep.target_path), sweep.config)
            result, started = self.training.run(sweep, exp, wt, stop)
            return self._record(sweep, exp, result, started, head, commit, wt, stop)
        except BaseException as exc:
            self._record_failure(exp, exc)
            raise
        finally:
            with self._lock:
                self._stops.pop(exp.id, None)
            if added_worktree:
                self.repo.remove_worktree(wt)

    def _prepare(self, sweep: Sweep, exp: Experiment) -> tuple[str, str] | Experiment:
        """Commit the diff on the current head; reject if it no longer applies."""
        head = self.repo.head(sweep.branch)
        if exp.is_baseline:
            commit = head
        else:
            problem = self.repo.check_applies(head, exp.diff)
            if problem:
                return self._finish(
                    exp,
                    Finish(
                        ExperimentStatus.REJECTED,
                        reason=(f"diff no longer applies to the sweep head {head[:7]}: {problem}"),
                    ),
                )
            commit = self.repo.commit_diff(
                head,
                exp.diff,
                f"{exp.description}\n\novernight experiment {exp.id} in sweep {sweep.name}",
            )
        ref = f"refs/overnight/{sweep.name}/{exp.id}"
        self.repo.set_ref(ref, commit)
        config = sweep.config
        if not exp.is_baseline:
            refused = self._refused_by_git(commit, config)
            if refused:
                return self._finish(exp, Finish(ExperimentStatus.REJECTED, reason=refused))
        expected = self.store.protected_hashes(sweep.id)
        actual = self.repo.file_hashes(commit, config.protected)
        changed = sorted(p for p in config.protected if actual.get(p) != expected.get(p))
        if changed:
            return self._finish(
                exp,
                Finish(
                    ExperimentStatus.REJECTED,
                    reason=(f"protected file(s) changed on the sweep branch: {', '.join(changed)}"),
                ),
            )
        self.store.mark_started(exp.id, commit=commit, ref=ref, base_commit=head)
        return head, commit

    def _refused_by_git(self, commit: str, config: TargetConfig) -> str | None:
        """Why git's own view of the commit is not admissible (None if it is)."""
        try:
            check_changes(self.repo.commit_changes(commit), config)
        except AdmissionError as exc:
            return f"refused after applying: {exc.message}"
        return None

    def _record(
        self,
        sweep: Sweep,
        exp: Experiment,
        result: RunResult,
        started: bool,
        head: str,
        commit: str,
        wt: Path,
        stop: threading.Event,
    ) -> Experiment:
        config = sweep.config
        ended = utcnow()
        common: dict[str, Any] = {
            "summary": result.summary,
            "log_tail": result.log_tail,
            "run_ended_at": ended,
        }
        if result.outcome is Outcome.STOPPED:
            return self._finish(
                exp, Finish(ExperimentStatus.CANCELLED, reason="cancelled while running", **common)
            )
        tampered = self._tampered(sweep, config, wt)
        raw = result.summary.get(config.metric)
        metric = float(raw) if isinstance(raw, int | float) else None
        if tampered:
            return self._finish(
                exp,
                Finish(
                    ExperimentStatus.CRASHED,
                    CrashKind.FUNDAMENTAL,
                    f"the run modified protected file(s): {', '.join(tampered)}",
                    **common,
                ),
            )
        if result.ok and metric is not None and math.isfinite(metric):
            current = self.store.get_sweep(sweep.name)
            if config.confirm_runs and (
                exp.is_baseline
                or is_improvement(metric, current.best_metric, current.direction, current.min_delta)
            ):
                mean, note = self.training.confirm(sweep, exp, wt, stop, metric)
                if mean is None:
                    status = (
                        ExperimentStatus.CRASHED if exp.is_baseline else ExperimentStatus.DISCARDED
                    )
                    return self._finish(
                        exp,
                        Finish(
                            status,
                            CrashKind.FUNDAMENTAL if exp.is_baseline else None,
                            note,
                            metric=metric,
                            best_before=current.best_metric,
                            **common,
                        ),
                    )
                metric, common["reason"] = mean, note
            # Slots of one process each have their own Loop: decisions on a sweep take turns
            # so that reading the best, recording a keep and moving the branch are one step.
            with _decision_lock(sweep.branch, sweep.target_path):
                return self._decide(sweep, exp, metric, head, commit, common)
        verdict = classify(
            CrashFacts(
                timed_out=result.outcome is Outcome.TIMED_OUT,
                fail_marker=result.fail_marker,
                exit_code=result.exit_code,
                signal=result.signal if result.outcome is Outcome.SIGNALED else None,
                error=result.error,
                log_tail=result.log_tail,
                training_started=started,
                has_metric=metric is not None,
            )
        )
        status = (
            ExperimentStatus.TIMEOUT
            if verdict.kind is CrashKind.TIMEOUT
            else ExperimentStatus.CRASHED
        )
        done = self._finish(
            exp,
            Finish(
                status,
                verdict.kind,
                verdict.reason,
                metric=metric,
                best_before=self.store.get_sweep(sweep.name).best_metric,
                **common,
            ),
        )
        if verdict.kind is CrashKind.TRIVIAL:
            self._repair(sweep, done)
        return done

    def _tampered(self, sweep: Sweep, config: TargetConfig, wt: Path) -> list[str]:
        expected = self.store.protected_hashes(sweep.id)
        watched = [*config.protected, *config.assets]
        actual = hash_worktree_files(wt, watched)
        return sorted(p for p in watched if p in expected and actual.get(p) != expected[p])

    def _decide(
        self,
        sweep: Sweep,
        exp: Experiment,
        metric: float,
        head: str,
        commit: str,
        common: dict[str, Any],
    ) -> Experiment:
        current = self.store.get_sweep(sweep.name)
        best = current.best_metric
        if exp.is_baseline:
            return self._finish(
                exp,
                Finish(ExperimentStatus.KEPT, metric=metric, best_before=None, **common),
                keep_commit=commit,
            )
        if not is_improvement(metric, best, current.direction, current.min_delta):
            return self._finish(
                exp, Finish(ExperimentStatus.DISCARDED, metric=metric, best_before=best, **common)
            )
        now_head = self.repo.head(sweep.branch)
        if now_head != head:  # another slot kept a change while this one ran
            return self._rerun_on_new_head(sweep, exp, metric, best, now_head, common)
        keep = commit
        # The DB learns first: a kill before the branch moves is repaired from the DB on start.
        done = self._finish(
            exp,
            Finish(ExperimentStatus.KEPT, metric=metric, best_before=best, **common),
            keep_commit=keep,
        )
        self.repo.advance_branch(sweep.branch, keep, now_head)
        return done

    def _rerun_on_new_head(
        self,
        sweep: Sweep,
        exp: Experiment,
        metric: float,
        best: float | None,
        now_head: str,
        common: dict[str, Any],
    ) -> Experiment:
        """It beat the best, but was measured without the change kept meanwhile: the
        combination has never run, so it is not kept; the same diff is re-queued on the new
        head (ahead of new proposals) and judged there."""
        conflict = self.repo.check_applies(now_head, exp.diff)
        why = (
            "beat the best but conflicts with the change kept meanwhile"
            if conflict
            else "beat the best, but the branch moved while it ran; re-queued on the new head"
        )
        done = self._finish(
            exp,
            Finish(
                ExperimentStatus.DISCARDED,
                metric=metric,
                best_before=best,
                **{**common, "reason": why},
            ),
        )
        if not conflict:
            again = Proposal(
                exp.description, exp.diff, exp.proposer, exp.id, {**exp.meta, "rerun_of": exp.id}
            )
            child = self.store.add_experiment(
                sweep.id, again, attempt=exp.attempt, priority=REPAIR_PRIORITY, base_commit=now_head
            )
            self.emit("queued", child)
        return done

    def _repair(self, sweep: Sweep, failed: Experiment) -> None:
        if self.proposer is None or failed.attempt >= self.settings.max_repairs:
            return
        if failed.proposer not in (self.proposer.name, "baseline"):
            return
        ctx = proposal_context(self.store, self.repo, self.store.get_sweep(sweep.name))
        fix = self.proposer.repair(ctx, failed)
        if fix is None:
            return
        fix = replace(fix, parent_id=failed.id)
        child = submit(
            self.store,
            self.repo,
            sweep,
            fix,
            record_rejection=True,
            attempt=failed.attempt + 1,
            priority=REPAIR_PRIORITY,
        )
        self.emit("queued" if child.status is ExperimentStatus.QUEUED else "finished", child)

    def _finish(
        self, exp: Experiment, finish: Finish, keep_commit: str | None = None
    ) -> Experiment:
        done = self.store.finish(exp.id, finish, keep_commit=keep_commit)
        self.emit("finished", done)
        return done

    def _record_failure(self, exp: Experiment, exc: BaseException) -> None:
        """An unexpected error (or Ctrl-C): never leave the row `running`."""
        try:
            current = self.store.get_experiment(exp.id)
            if current.status.is_finished():
                return
            status = (
                ExperimentStatus.CANCELLED
                if isinstance(exc, KeyboardInterrupt)
                else ExperimentStatus.INTERRUPTED
            )
            self.store.finish(exp.id, Finish(status, reason=f"service error: {exc!r}"[:500]))
        except Exception:
            logger.exception("could not record the failure of experiment %s", exp.id)
