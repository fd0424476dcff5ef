"""The coding-agent tools (MCP over stdio and HTTP, JSON function schemas) over Store and Repo.

Each tool is a plain method with typed arguments and a pydantic result, so the MCP server,
`overnight tools` and tests share one definition. Proposals go through the same admission as
the API (`agent.ops.admission`, nothing written when refused); execution belongs to whichever
service runs the database's queue. Imports no MCP, no HTTP.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, Field

from agent.analysis.insights import render
from agent.analysis.insights_fold import digest
from agent.analysis.projection import ExperimentView
from agent.analysis.report import evidence_header, fmt_metric
from agent.analysis.secondary import by_experiment
from agent.core.domain import ExperimentStatus, Proposal, as_utc
from agent.core.errors import AdmissionError
from agent.core.ports import Store
from agent.ops.service import Service, holdout_key, read_log
from agent.ops.sweeps import read_program

logger = logging.getLogger(__name__)
MAX_WAIT_S = 3600.0
POLL_S = 0.5
LOG_TAIL_LINES = 40

SweepArg = Annotated[str, Field(description="sweep name, e.g. 'nov29'")]
IdArg = Annotated[int, Field(description="experiment id returned by propose_experiment")]
WHEN = "this ISO 8601 time (UTC unless it has an offset), e.g. 2026-11-29T22:00Z"

# One line each, as an LLM reads them in a tool list.
DESCRIPTIONS = {
    "get_target": "Read the sweep's rules: program.md, editable/protected files, metric, "
                  "direction, time budget and how many experiments are left.",
    "get_best": "Get the current best metric and commit, and the full current content of the "
                "editable file(s) that your next diff must apply to.",
    "propose_experiment": "Queue one experiment: a one-line description and a unified diff "
                          "against the current best files; refused at once with the reason.",
    "wait_for_experiment": "Block until an experiment finishes (or timeout_s passes); returns "
                           "status, metric (the mean of its runs), delta vs the incumbent "
                           "runs it was compared with, the target's secondary keys' means, "
                           "crash class and the log tail.",
    "list_experiments": "List the sweep's experiments, newest first (optionally one status, "
                        "or those created since/until a time).",
    "get_results_table": "The sweep's results as autoresearch's results.tsv, with baseline and "
                         "best on top.",
    "get_log": "The last lines of an experiment's training log (read it after a crash).",
    "cancel_experiment": "Cancel a queued experiment, or ask a running one to stop.",
    "get_report": "The sweep's morning report as Markdown: baseline → best with its interval, "
                  "each kept change with its evidence and diff stat, what was learned, crashes "
                  "by kind and cause, cost, the attribution of an ablation, what to try next.",
    "get_insights": "What the sweep has learned so far: per-knob effects with uncertainty, "
                    "near-misses worth re-testing or combining, crash regions to avoid, plateau "
                    "status, categories over-explored or capped. Read it before proposing.",
}


class TargetInfo(BaseModel):
    sweep: str
    status: str
    proposer: str
    target_path: str
    branch: str
    editable: list[str]
    protected: list[str]
    metric: str
    direction: str
    budget_s: float
    timeout_s: float
    max_experiments: int | None
    budget: str | None = None  # a compute budget ("600 steps"), in place of budget_s
    experiments_done: int
    experiments_left: int | None
    deadline: str | None
    program: str


class BestInfo(BaseModel):
    sweep: str
    metric: str
    direction: str
    baseline_metric: float | None
    best_metric: float | None
    best_commit: str | None
    best_experiment_id: int | None
    head_commit: str
    files: dict[str, str]


class Proposed(BaseModel):
    id: int
    status: str
    queued_ahead: int
    message: str


class ExperimentResult(ExperimentView):
    """The projection of an experiment, with what an agent waiting for it needs."""

    finished: bool
    improved: bool
    best_metric: float | None
    log_tail: str | None  # the last lines, for a crash or a timeout
    waited_s: float


class ExperimentList(BaseModel):
    sweep: str
    count: int
    data: list[ExperimentView]


class LogTail(BaseModel):
    id: int
    status: str
    lines: int
    text: str


class Cancelled(BaseModel):
    id: int
    status: str
    pending: bool
    message: str


class InsightsInfo(BaseModel):
    sweep: str
    text: str  # the digest, as a model reads it
    data: dict[str, Any]  # the same, structured


class AgentTools:
    """Tool implementations on the service layer (agent.ops.service.Service): the same queue,
    cancel, log and results operations as the REST API and the CLI."""

    def __init__(self, service: Service) -> None:
        self.service = service

    @property
    def store(self) -> Store:
        return self.service.store

    # --- reading --------------------------------------------------------------------------
    def get_target(self, sweep: SweepArg) -> TargetInfo:
        s = self.store.get_sweep(sweep)
        config = s.config
        usage = self.service.usage(s)
        return TargetInfo(
            sweep=s.name, status=s.status.value, proposer=s.proposer, target_path=s.target_path,
            branch=s.branch, editable=list(config.editable), protected=list(config.protected),
            metric=config.metric, direction=config.direction, budget_s=config.budget_s,
            budget=None if config.budget is None else str(config.budget),
            timeout_s=config.timeout_s, max_experiments=s.max_experiments,
            experiments_done=usage.used, experiments_left=usage.left,
            deadline=s.deadline.isoformat() if s.deadline else None, program=read_program(s))

    def get_best(self, sweep: SweepArg) -> BestInfo:
        s = self.store.get_sweep(sweep)
        head, files = self.service.best_files(s)
        return BestInfo(sweep=s.name, metric=s.metric, direction=s.direction.value,
                        baseline_metric=s.baseline_metric, best_metric=s.best_metric,
                        best_commit=(s.best_commit or "")[:7] or None,
                        best_experiment_id=s.best_experiment_id, head_commit=head[:7],
                        files=files)

    def list_experiments(
        self, sweep: SweepArg,
        status: Annotated[str | None, Field(description="only this status: queued, running, "
                                            "kept, discarded, crashed, timeout, rejected, "
                                            "cancelled")] = None,
        limit: Annotated[int, Field(ge=1, le=500, description="at most this many")] = 50,
        since: Annotated[str | None, Field(description=f"only those created at or after {WHEN}")]
        = None,
        until: Annotated[str | None, Field(description=f"only those created before {WHEN}")]
        = None,
    ) -> ExperimentList:
        s = self.store.get_sweep(sweep)
        statuses = [_status(status)] if status else None
        exps = self.store.list_experiments(s.id, statuses, limit=limit, newest_first=True,
                                           since=_when("since", since),
                                           until=_when("until", until))
        # each `[target] secondary` key's mean over the runs its value rests on
        keys = s.config.secondary
        runs = [r for e in exps for r in self.store.list_runs(experiment_id=e.id)] if keys else []
        secondary = by_experiment(exps, runs, keys)
        return ExperimentList(sweep=s.name, count=len(exps),
                              data=[ExperimentView.of(e, s.name, secondary=secondary.get(e.id))
                                    for e in exps])

    def get_results_table(self, sweep: SweepArg) -> str:
        s = self.store.get_sweep(sweep)
        queued = self.store.count_experiments(s.id, [ExperimentStatus.QUEUED])
        running = self.store.count_experiments(s.id, [ExperimentStatus.RUNNING])
        head = (f"# sweep {s.name} ({s.status.value}): {s.metric} {s.direction.value}, "
                f"baseline {fmt_metric(s.baseline_metric)}, best {fmt_metric(s.best_metric)}"
                f" ({(s.best_commit or '')[:7] or '-'}); {running} running, {queued} queued\n")
        ev = self.service.evidence(s)
        head += f"# {evidence_header(ev, s.metric)}\n# {ev.statement()}\n"
        return head + self.service.results_tsv(s, full=True)

    def get_insights(
        self, sweep: SweepArg,
        max_chars: Annotated[int, Field(ge=500, le=50_000, description="length of the text "
                                        "digest at most")] = 6000,
    ) -> InsightsInfo:
        s = self.store.get_sweep(sweep)
        found = digest(s, self.store.list_experiments(s.id))
        return InsightsInfo(sweep=s.name, text=render(found, max_chars), data=found.to_dict())

    def get_report(self, sweep: SweepArg) -> str:
        from agent.analysis.morning_md import render_markdown
        from agent.ops.morning import report_of

        return render_markdown(report_of(self.store, sweep))

    def get_log(self, id: IdArg,
                tail: Annotated[int, Field(ge=1, le=2000, description="lines")] = 100) -> LogTail:
        exp = self.store.get_experiment(id)
        text = read_log(exp, tail_lines=tail, sealed=holdout_key(self.store, exp))
        return LogTail(id=exp.id, status=exp.status.value, lines=len(text.splitlines()),
                       text=text)

    # --- acting ---------------------------------------------------------------------------
    def propose_experiment(
        self, sweep: SweepArg,
        description: Annotated[str, Field(description="one line: what changes and why")],
        diff: Annotated[str, Field(description="unified diff (--- a/train.py, +++ b/train.py, "
                                   "@@ hunks) against the current best files from get_best")],
    ) -> Proposed:
        proposal = Proposal(description=description, diff=diff, proposer="agent")
        try:
            exp = self.service.queue(sweep, proposal)
        except AdmissionError as exc:
            raise AdmissionError(exc.code, f"rejected ({exc.code}): {exc.message}",
                                 exc.status_hint) from None
        ahead = sum(1 for e in self.store.list_experiments(
            exp.sweep_id, [ExperimentStatus.QUEUED, ExperimentStatus.RUNNING]) if e.id < exp.id)
        return Proposed(id=exp.id, status=exp.status.value, queued_ahead=ahead,
                        message=f"queued as experiment {exp.id}; call wait_for_experiment("
                        f"{exp.id}) for the result")

    def experiment_result(self, id: int, waited_s: float = 0.0) -> ExperimentResult:
        exp = self.store.get_experiment(id)
        s = self.store.get_sweep_by_id(exp.sweep_id)
        crashed = exp.status in (ExperimentStatus.CRASHED, ExperimentStatus.TIMEOUT)
        tail = "\n".join((exp.log_tail or "").splitlines()[-LOG_TAIL_LINES:]) if crashed else None
        return ExperimentResult(
            **ExperimentView.fields_of(exp, s.name, runs=self.store.list_runs(
                experiment_id=id) if exp.status is not ExperimentStatus.QUEUED else None,
                keys=s.config.secondary),
            finished=exp.status.is_finished(),
            improved=exp.status is ExperimentStatus.KEPT, best_metric=s.best_metric,
            log_tail=tail, waited_s=round(waited_s, 1))

    def wait_for_experiment(
        self, id: IdArg,
        timeout_s: Annotated[float, Field(ge=0, le=MAX_WAIT_S, description="seconds to wait at "
                                          "most; call again if it is still running")] = 600,
    ) -> ExperimentResult:
        """Blocking version (the MCP server polls asynchronously with the same reads)."""
        start = time.monotonic()
        while True:
            result = self.experiment_result(id, time.monotonic() - start)
            if result.finished or time.monotonic() - start >= timeout_s:
                return result
            time.sleep(POLL_S)

    def cancel_experiment(self, id: IdArg) -> Cancelled:
        exp, pending = self.service.cancel(id, reason="cancelled by the agent")
        message = (f"experiment {exp.id} was asked to stop; it will be recorded cancelled"
                   if pending else f"experiment {exp.id} is {exp.status.value}")
        return Cancelled(id=exp.id, status=exp.status.value, pending=pending, message=message)


TOOL_NAMES = tuple(DESCRIPTIONS)


def _status(value: str) -> ExperimentStatus:
    try:
        return ExperimentStatus(value)
    except ValueError:
        names = ", ".join(s.value for s in ExperimentStatus)
        raise AdmissionError("bad_status", f"unknown status {value!r} (one of {names})") from None


def _when(name: str, value: str | None) -> datetime | None:
    """An ISO 8601 time as aware UTC (naive = UTC); AdmissionError naming `name` if not one."""
    if not value:
        return None
    try:
        return as_utc(datetime.fromisoformat(value))
    except ValueError:
        raise AdmissionError("bad_time", f"{name}: {value!r} is not an ISO 8601 date or "
                             "date-time, e.g. 2026-11-29T22:00Z") from None


def agent_instructions(tools: AgentTools, sweep: str) -> str:
    """A program.md-style brief telling a coding agent how to run the loop through the tools."""
    t = tools.get_target(sweep)
    better = "lower" if t.direction == "minimize" else "higher"
    limit = (f"{t.experiments_left} of {t.max_experiments} experiments are left"
             if t.max_experiments is not None else "the sweep has no experiment limit")
    if t.deadline:
        limit += f"; the deadline is {t.deadline}"
    files = ", ".join(t.editable)
    run_budget = (f"Every run trains for {t.budget_s:g} s of wall clock (killed at "
                  f"{t.timeout_s:g} s), so a\n  faster change that sees more data can win."
                  if t.budget is None else
                  f"Every run trains {t.budget} (killed at {t.timeout_s:g} s of wall clock), "
                  "so\n  a faster change gains nothing but time.")
    text = f"""# Research loop for sweep `{t.sweep}` (driven through the overnight tools)

You are an autonomous researcher. The overnight service owns the git state, the time budget
and the records: you only propose changes and read results, through these tools
(MCP server `overnight`): get_target, get_best, get_insights, propose_experiment,
wait_for_experiment, get_log, list_experiments, get_results_table, cancel_experiment.

## The setting

- Metric: `{t.metric}`, {better} is better. A change is kept only if it improves the best;
  otherwise the service resets it. Equal is not better.
- {run_budget}
- You may change only: {files}. Never try to change {', '.join(t.protected) or 'the harness'}:
  such proposals are refused.
- Limits: {limit}. The service stops the sweep there.

## The loop (never stop on your own; only the sweep's limits end it)

1. `get_best("{t.sweep}")`: the current best file(s). Every diff must apply to exactly these.
2. `get_insights("{t.sweep}")`: what was learned (effects per knob, near-misses, crash
   regions, plateau). Think of ONE idea it suggests. Write a one-line description and a diff
   (`--- a/{t.editable[0]}`, `+++ b/{t.editable[0]}`, `@@` hunks) against those files.
3. `propose_experiment("{t.sweep}", description, diff)`. If it is refused, read the reason
   (diff does not apply, duplicate, protected file...), fix the proposal and try again.
4. `wait_for_experiment(id)`; if it returns still running, call it again.
5. Read the result: kept (now the new best: fetch get_best again before the next diff),
   discarded (worse or equal), crashed or timeout.
6. On a crash call `get_log(id)`. A trivial bug (typo, missing import, wrong shape): fix it
   and propose the corrected diff again. A fundamental failure (out of memory, NaN, diverging
   loss): log it mentally and move on to another idea. Timeouts mean the change is too slow.
7. `get_results_table("{t.sweep}")` now and then to see what was tried; do not repeat it.
8. Go back to 1.

Prefer small, simple changes; a tiny gain bought with a lot of ugly code is not worth it.
Seed noise is of the order of many small "wins": treat a keep as evidence, not proof.
"""
    if t.program.strip():
        text += f"\n## The target's program.md\n\n{without_manual_loop(t.program).strip()}\n"
    return text


_LOOP_HEADING = re.compile(r"^#{1,3}\s+(?:the\s+)?(?:experiment\s+|research\s+)?loop\b",
                           re.IGNORECASE)


def without_manual_loop(program: str) -> str:
    """program.md minus its hand-run loop (commit, run, `git reset`): here the service owns git
    and the runs, so that section would contradict the tools' loop above."""
    out: list[str] = []
    skipping = False
    for line in program.splitlines():
        if line.startswith("#"):
            skipping = bool(_LOOP_HEADING.match(line))
            if skipping:
                out.append(f"{line}\n\n(Left out: the service commits, runs, keeps and resets; "
                           "use the loop above.)")
                continue
        if not skipping and "git reset" not in line:
            out.append(line)
    return "\n".join(out)
