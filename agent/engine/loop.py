"""One experiment at a time: claim → commit → worktree → run → classify → decide → record.

The core of the product. Talks to git, the database, the runner and the proposer only through
the ports in agent.core.ports. Every run's outcome is recorded; only unexpected errors re-raise.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.core.config import TargetConfig
from agent.core.diff import PathChange, diff_stats
from agent.core.domain import (
    CONTINUATION_PRIORITY,
    Experiment,
    ExperimentStatus,
    Proposal,
    Run,
    RunRole,
    RunSpec,
    RunStatus,
    Sweep,
    SweepStatus,
    utcnow,
)
from agent.core.errors import (
    LOST_PREFIX,
    NO_SPACE_PREFIX,
    AdmissionError,
    PatchError,
    RunNotStartedError,
    WorkerLostError,
    interrupt_reason,
    is_out_of_space,
)
from agent.core.ports import Proposer, Repo, Runner, Store
from agent.engine.attempt import (
    EventFn,
    LoopSettings,
    TrainingRuns,
    budget_parts,
    emit_to,
    stop_point,
)
from agent.engine.gather import earlier_tests, gather, sample, write_run_statuses
from agent.engine.incumbent import Incumbent, decision_lock
from agent.engine.recovery import baseline_pause_reason, requeue_once
from agent.engine.salvage import training_finished
from agent.engine.writes import DiskSpaceWatch, space_checking_runner, space_waiting_store
from agent.git.repo import hash_worktree_files
from agent.ops.admission import admit, queue, reject
from agent.ops.sweeps import link_assets, proposal_context
from agent.rules.admit import check_changes
from agent.rules.classify import CrashFacts
from agent.rules.contract import baseline_warnings, contract_warnings
from agent.rules.decide import Evidence, Rule, RunFailure, Verdict, decide
from agent.rules.endings import cancelled, finish_of, interrupted, not_started, refused
from runner.result import Outcome, RunResult

logger = logging.getLogger(__name__)
REPAIR_PRIORITY = CONTINUATION_PRIORITY
MAX_REJECTED_IN_A_ROW = 5


def _refused_by_git(changes: list[PathChange], config: TargetConfig) -> str | None:
    """Why git's own view of the commit's changes is not admissible (None if it is)."""
    try:
        check_changes(changes, config)
    except AdmissionError as exc:
        return f"refused after applying: {exc.message}"
    return None


class Loop:
    def __init__(
        self,
        store: Store,
        repo: Repo,
        runner: Runner,
        settings: LoopSettings,
        proposer: Proposer | None = None,
        on_event: EventFn | None = None,
        disk_space: DiskSpaceWatch | None = None,
    ) -> None:
        # A lack of space is waited out, not judged (agent.engine.writes): the loop's store
        # retries each call through it, and its runs never wait on the disk.
        self.disk_space = disk_space or DiskSpaceWatch()
        store = space_waiting_store(store, self.disk_space)
        self.store, self.repo, self.runner = store, repo, runner
        self.settings, self.proposer = settings, proposer
        self.on_event = on_event
        self.training = TrainingRuns(store, space_checking_runner(runner, self.disk_space),
                                     settings, self.emit)
        self.incumbent = Incumbent(store, repo, settings, self.training)
        self._stops: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def emit(self, kind: str, exp: Experiment, data: dict[str, Any] | None = None) -> None:
        emit_to(self.on_event, kind, exp, data)

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
            queued = self._submit(sweep, proposal)
            if queued.status is ExperimentStatus.QUEUED:
                return queued
            self.emit("finished", queued)
        self._record_out_of_ideas(sweep, f"{MAX_REJECTED_IN_A_ROW} proposals in a row were "
                                  "refused: the proposer counts as out of ideas")
        return None

    def _record_out_of_ideas(self, sweep: Sweep, why: str | None = None) -> None:
        """A proposer that can say why it has nothing (e.g. no knobs in the target), or the
        loop's own reason for giving up on it, is recorded as a rejected row, so the sweep
        does not end in a silent `done` and its last row says what ended it."""
        why = why or (self.proposer.out_of_ideas if self.proposer is not None else None)
        if self.proposer is None or not why:
            return
        logger.warning("sweep %s: %s", sweep.name, why)
        row = self.store.add_experiment(
            sweep.id, Proposal("the proposer has nothing to propose", "", self.proposer.name),
            ended=finish_of(refused(why)))
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
    def execute(
        self, sweep: Sweep, exp: Experiment, stop: threading.Event | None = None
    ) -> Experiment:
        """Run a claimed (running) experiment to a finished record. Never leaves it running.

        `stop` (the scheduler makes it at claim time) may be set before the run starts: the
        experiment is then recorded `cancelled` without running.
        """
        wt = self.settings.work_dir / "worktrees" / sweep.name / f"exp-{exp.id}"
        stop = stop if stop is not None else threading.Event()
        with self._lock:
            self._stops[exp.id] = stop
        added_worktree = False
        try:
            prepared = None if stop.is_set() else self._prepare(sweep, exp)
            if isinstance(prepared, Experiment):
                return prepared
            if prepared is None or stop.is_set():
                return self._end(exp, cancelled("cancelled before it started"))
            head, commit = prepared
            added_worktree = True  # a half-made one (the disk filled) is removed too
            self.repo.add_worktree(wt, commit)
            link_assets(wt, Path(sweep.target_path), sweep.config)
            self.incumbent.remeasure(sweep, exp, head, stop)
            return self._run_until_verdict(sweep, exp, head, commit, wt, stop)
        except WorkerLostError as exc:
            return self._interrupt_and_requeue(exp, f"{LOST_PREFIX}{exc}")
        except RunNotStartedError as exc:
            return self._not_started(exp, str(exc))
        except BaseException as exc:
            if not self.disk_space.stopped and self.disk_space.note_failure(
                    exc, f"experiment {exp.id}", probe=True):
                return self._interrupt_and_requeue(exp, f"{NO_SPACE_PREFIX}{exc}")
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
        changes: list[PathChange] = []
        if exp.is_baseline:
            commit = head
        else:
            message = f"{exp.description}\n\novernight experiment {exp.id} in sweep {sweep.name}"
            try:
                commit, changes = self.repo.commit_proposal(head, exp.diff, message)
            except PatchError as exc:
                why = f"diff no longer applies to the sweep head {head[:7]}: {exc}"
                return self._end(exp, refused(why))
        ref = f"refs/overnight/{sweep.name}/{exp.id}"
        self.repo.set_ref(ref, commit)
        config = sweep.config
        if not exp.is_baseline:
            not_admitted = _refused_by_git(changes, config)
            if not_admitted:
                return self._end(exp, refused(not_admitted))
        expected = self.store.protected_hashes(sweep.id)
        actual = self.repo.file_hashes(commit, config.protected)
        changed = sorted(p for p in config.protected if actual.get(p) != expected.get(p))
        if changed:
            return self._end(exp, refused(
                f"protected file(s) changed on the sweep branch: {', '.join(changed)}"))
        self.store.mark_started(exp.id, commit=commit, ref=ref, base_commit=head)
        return head, commit

    def _run_until_verdict(
        self,
        sweep: Sweep,
        exp: Experiment,
        head: str,
        commit: str,
        wt: Path,
        stop: threading.Event,
    ) -> Experiment:
        """Run the commit until decide() gives a verdict; carry the verdict out."""
        config = sweep.config
        rule = Rule.of(config)
        seed, role = rule.seed, RunRole.BASELINE if exp.is_baseline else RunRole.SCREEN
        pair_run_id: int | None = None  # the keep rule asked for the incumbent paired with it
        verdict = Verdict(None, incumbent=False)
        while True:
            if verdict.incumbent:
                failed = self._run_incumbent_paired(sweep, exp, head, stop, seed, pair_run_id)
            else:
                spec = RunSpec(sweep.id, exp.id, commit, seed, role)
                result, started, run = self.training.run(sweep, exp, wt, stop, spec)
                failed = self._run_failure(sweep, config, wt, result, started, run)
            # Slots of one process each have their own Loop: decisions on a sweep take turns
            # so that reading the best, recording a keep and moving the branch are one step.
            with decision_lock(sweep.branch, sweep.target_path):
                evidence, now_head, change_runs, incumbent_runs = self._evidence(
                    sweep, exp, head, commit, failed)
                verdict = decide(evidence, rule)
                write_run_statuses(self.store, change_runs, incumbent_runs, verdict)
                # the best's re-runs flagged and its recorded mean re-read (record_best alone)
                self.incumbent.record_best(sweep, head)
                if verdict.status is not None:
                    done = self._record_verdict(sweep, exp, verdict, result, head, commit,
                                                change_runs)
            if verdict.status is not None:
                break
            seed = verdict.seed if verdict.seed is not None else seed + 1
            pair_run_id = verdict.pair_of
            if not verdict.incumbent:
                role = RunRole.BASELINE if exp.is_baseline else RunRole.CONFIRM
        if verdict.repair:
            self._repair(sweep, done)
        if verdict.requeue:
            self._requeue(sweep, exp, now_head)
        return done

    def _run_failure(
        self,
        sweep: Sweep,
        config: TargetConfig,
        wt: Path,
        result: RunResult,
        started: bool,
        run: Run,
    ) -> RunFailure | None:
        """The latest run as a failure, or None when it produced a usable metric."""
        if run.status is RunStatus.PRUNED:  # clearly behind: the rule discards it
            return RunFailure(early_stop=stop_point(run, budget_parts(config)[0]),
                              error=run.note or "")
        if result.outcome is Outcome.STOPPED:
            return RunFailure(stopped=True)
        tampered = self._changed_protected_files(sweep, config, wt)
        if tampered:
            return RunFailure(tampered=tuple(tampered))
        if run.status is RunStatus.OK:
            return None
        facts = CrashFacts(
            timed_out=result.outcome is Outcome.TIMED_OUT,
            fail_marker=result.fail_marker,
            exit_code=result.exit_code,
            signal=result.signal if result.outcome is Outcome.SIGNALED else None,
            error=result.error,
            log_tail=result.log_tail,
            training_started=started,
            has_metric=run.metric is not None,
            training_finished=training_finished(wt),
        )
        why = result.error or ("FAIL" if result.fail_marker else result.outcome.value)
        return RunFailure(facts=facts, error=why)

    def _run_incumbent_paired(self, sweep: Sweep, exp: Experiment, head: str,
                              stop: threading.Event, seed: int,
                              pair_of: int | None) -> RunFailure | None:
        """The incumbent's run paired with the change's (the keep rule asked): a failure only
        when it was stopped or produced no metric."""
        run = self.incumbent.run_paired(sweep, exp, head, stop, seed, pair_of)
        if run.status is RunStatus.CANCELLED:
            return RunFailure(stopped=True)
        if run.status is not RunStatus.OK:
            return RunFailure(incumbent=True, error=f"run {run.id} ended {run.status.value}")
        return None

    def _evidence(
        self, sweep: Sweep, exp: Experiment, head: str, commit: str, failed: RunFailure | None
    ) -> tuple[Evidence, str, list[Run], list[Run]]:
        """What the decision needs, from the store and git: runs, the incumbent's, the head."""
        keys = sweep.config.bounded_keys
        gathered = gather(self.store, sweep.id, exp, head, commit, sweep.config.time_budget,
                          keys)
        now_head = head if exp.is_baseline else self.repo.head(sweep.branch)
        moved = now_head != head
        added, removed = diff_stats(exp.diff) if not exp.is_baseline else (0, 0)
        evidence = Evidence(
            is_baseline=exp.is_baseline,
            runs=tuple(sample(r, keys) for r in gathered.change_runs),
            best=tuple(sample(r, keys) for r in gathered.incumbent_runs),
            lines=added - removed,
            others=gathered.others,
            speed_noise=gathered.speed_noise,
            failed=failed,
            head_moved=moved,
            conflict=self.repo.check_applies(now_head, exp.diff) if moved else None,
            tests=() if exp.is_baseline else earlier_tests(self.store, sweep.id),
            started_seeds=gathered.incumbent_seeds,
        )
        return evidence, now_head, gathered.change_runs, gathered.incumbent_runs

    def _record_verdict(
        self,
        sweep: Sweep,
        exp: Experiment,
        verdict: Verdict,
        result: RunResult,
        head: str,
        commit: str,
        change_runs: list[Run],
    ) -> Experiment:
        """Write the verdict; a keep is recorded first (with the new best's value, worked out
        by agent.engine.incumbent), then the branch moves. The baseline also says when its
        repeats cannot measure the noise or the load."""
        raw = result.summary.get(sweep.config.metric)
        warnings = tuple(contract_warnings(result.summary, sweep.budget_s,
                                           sweep.config.budget)) + (
            baseline_warnings([sample(r, sweep.config.bounded_keys) for r in change_runs],
                              sweep.config.metric, sweep.config.constraints)
            if exp.is_baseline else ())
        printed = float(raw) if isinstance(raw, int | float) else None
        if not verdict.keep:
            return self._end(exp, verdict, summary=result.summary, log_tail=result.log_tail,
                             warnings=warnings, printed=printed)
        # The DB learns first: a kill before the branch moves is repaired from the DB on start.
        done = self._end(exp, verdict, summary=result.summary, log_tail=result.log_tail,
                         warnings=warnings, keep_commit=commit,
                         best=self.incumbent.value_of(sweep, commit))
        self.incumbent.record_best(sweep, commit)  # its re-runs' statuses (the value is set)
        if not exp.is_baseline:
            self.disk_space.retry_while_disk_full(
                lambda: self.repo.advance_branch(sweep.branch, commit, head), "moving the branch")
        return done

    def _changed_protected_files(self, sweep: Sweep, config: TargetConfig, wt: Path) -> list[str]:
        expected = self.store.protected_hashes(sweep.id)
        watched = [*config.protected, *config.assets]
        actual = hash_worktree_files(wt, watched)
        return sorted(p for p in watched if p in expected and actual.get(p) != expected[p])

    def _requeue(self, sweep: Sweep, exp: Experiment, now_head: str) -> None:
        """It looked promising, but was measured without the change kept meanwhile: the
        combination has never run, so the same diff is re-queued on the new head (ahead of
        new proposals) and judged there."""
        rerun = Proposal(
            exp.description, exp.diff, exp.proposer, exp.id, {**exp.meta, "rerun_of": exp.id}
        )
        child = self.store.add_experiment(
            sweep.id, rerun, attempt=exp.attempt, priority=REPAIR_PRIORITY, base_commit=now_head
        )
        self.emit("queued", child)

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
        child = self._submit(sweep, fix, attempt=failed.attempt + 1, priority=REPAIR_PRIORITY)
        self.emit("queued" if child.status is ExperimentStatus.QUEUED else "finished", child)

    def _submit(self, sweep: Sweep, proposal: Proposal, *, attempt: int = 0,
                priority: int = 0) -> Experiment:
        """Admit and queue the proposer's own proposal; a refusal is recorded `rejected`."""
        try:
            return queue(self.store, admit(self.store, self.repo, sweep, proposal),
                         attempt=attempt, priority=priority)
        except AdmissionError as refusal:
            return reject(self.store, sweep, proposal, refusal, attempt=attempt)

    def _end(self, exp: Experiment, verdict: Verdict, *, keep_commit: str | None = None,
             summary: dict[str, Any] | None = None, log_tail: str | None = None,
             warnings: tuple[str, ...] = (), printed: float | None = None,
             best: float | None = None) -> Experiment:
        """The one place this loop writes an experiment's end: the verdict as its record
        (agent.rules.endings.finish_of)."""
        finish = finish_of(verdict, summary=summary, log_tail=log_tail, run_ended_at=utcnow(),
                           warnings=warnings, printed=printed, best=best)
        done = self.store.finish(exp.id, finish, keep_commit=keep_commit)
        self.emit("finished", done)
        return done

    def _interrupt_and_requeue(self, exp: Experiment, why: str) -> Experiment:
        """A remote worker went away mid-run, or the disk filled up under it: no result, so
        the experiment is `interrupted` (once writes succeed) and queued again exactly once
        (the store refuses a second retry row)."""
        logger.warning("experiment %s: %s", exp.id, why)
        done = self._end(exp, interrupted(why[:500]))
        follow_up = requeue_once(self.store, done)  # its retry, or its verdict past the cap
        if follow_up is not None:
            self.emit("finished" if follow_up.status.is_finished() else "queued", follow_up)
        pause = baseline_pause_reason(follow_up) if follow_up is not None else None
        if pause is not None:
            sweep = self.store.get_sweep_by_id(exp.sweep_id)
            logger.error("sweep %s paused: %s", sweep.name, pause)
            if sweep.status is SweepStatus.RUNNING:
                self.store.set_sweep_status(sweep.name, SweepStatus.PAUSED)
        return done

    def _not_started(self, exp: Experiment, why: str) -> Experiment:
        """The executor could not start its run: recorded `not started` (no result, nothing
        judged) and queued again as a linked row; the engine pauses the sweep until the fix."""
        logger.info("experiment %s was not started: %s", exp.id, why)  # the engine says it
        done = self._end(exp, not_started(why[:500]))
        retry = requeue_once(self.store, done)
        if retry is not None:
            self.emit("queued", retry)
        return done

    def _record_failure(self, exp: Experiment, exc: BaseException) -> None:
        """An unexpected error (or Ctrl-C): never leave the row `running`."""
        try:
            current = self.store.get_experiment(exp.id)
            if current.status.is_finished():
                return
            asked = isinstance(exc, KeyboardInterrupt)  # Ctrl-C/SIGTERM: re-run on resume
            reason = (interrupt_reason(exc) if isinstance(exc, KeyboardInterrupt)
                      else f"service error: {exc!r}"[:500])
            self.store.finish(exp.id, finish_of(interrupted(reason, on_purpose=asked)))
        except Exception as failed:
            if not is_out_of_space(failed):
                logger.exception("could not record the failure of experiment %s", exp.id)
                return
            logger.error("experiment %s: no space to record its end (%s); the next start's "
                         "recovery re-queues it", exp.id, failed)
