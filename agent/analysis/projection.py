"""One experiment as every interface shows it: REST, the MCP tools and `results --format json`.

`ExperimentView.of(experiment, sweep_name)` is the only serialization of an experiment: the API's
`ExperimentPublic` is this model, the MCP tools list it and extend it (a waited-for result), and
`overnight results --format json` prints it beside each experiment's evidence. A new field on
an experiment is added here once and appears everywhere. `secondary` holds the means of the
target's `[target] secondary` keys (agent.analysis.secondary) when the caller gives the keys.
`llm` is a language model's part in it (LLMView: the conversation, errors, tokens), `LLMSpend`
a sweep's total.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from agent.analysis.secondary import SecondaryMean, run_value, secondary_means
from agent.core.domain import Experiment, Run, RunStatus


def reported_memory_gb(exp: Experiment) -> float | None:
    """Peak memory in GB (one decimal) from the summary's peak_memory_mb or peak_vram_mb; None
    when the script reported none (the screens leave it blank)."""
    mb = exp.summary.get("peak_memory_mb", exp.summary.get("peak_vram_mb"))
    if not isinstance(mb, int | float) or not math.isfinite(mb):
        return None
    return round(mb / 1024, 1)


def memory_gb(exp: Experiment) -> float:
    """The same, 0.0 when not reported: autoresearch's results.tsv column (and its JSON)."""
    return reported_memory_gb(exp) or 0.0


CONVERSATION_KEY = "llm_conversation"  # in meta (agent.proposers.llm); shown as llm


class LLMTurn(BaseModel):
    """One call of a conversation: what was asked, the answer, what was wrong with it."""

    asked: str = Field(description="the proposal prompt, or a re-ask after an unusable answer")
    format: str | None = Field(None, description="json_schema | json_object | tools | text")
    answer: str | None = Field(None, description="the model's answer (clipped); none when "
                               "the call failed")
    error: str | None = Field(None, description="why it could not be used (code: message)")
    tokens_in: int | None = None
    tokens_out: int | None = None
    seconds: float | None = None
    max_tokens: int | None = None
    finish: str | None = None


class LLMView(BaseModel):
    """What a language model said and spent for one experiment."""

    model: str | None
    tokens_in: int
    tokens_out: int
    usd: float
    calls: int
    estimated: bool = Field(description="some counts are estimates (a timed-out call)")
    rejection: str | None = Field(description="what the model did wrong, for a proposal "
                                  "refused as unusable")
    errors: list[str]
    conversation: list[LLMTurn] = Field(description="every call, oldest first (only when one "
                                        "experiment is asked for, and in results json)")

    @classmethod
    def of(cls, meta: dict[str, Any], with_conversation: bool = True) -> LLMView | None:
        usage = meta.get("llm_usage")
        if not isinstance(usage, dict):
            return None
        turns = meta.get(CONVERSATION_KEY) if with_conversation else []
        if not isinstance(turns, list):  # records from before conversations were kept
            raw = meta.get("raw_answer") if with_conversation else None
            turns = [{"asked": "the proposal prompt", "answer": raw}] if raw else []
        unusable = meta.get("unusable")
        return cls(model=meta.get("llm_model"), tokens_in=int(usage.get("tokens_in", 0)),
                   tokens_out=int(usage.get("tokens_out", 0)),
                   usd=float(usage.get("usd", 0.0)), calls=int(usage.get("calls", 0)),
                   estimated=bool(usage.get("estimated")),
                   rejection=unusable.get("message") if isinstance(unusable, dict) else None,
                   errors=[str(e) for e in meta.get("llm_errors", [])],
                   conversation=[LLMTurn.model_validate(t) for t in turns
                                 if isinstance(t, dict)])


class LLMSpend(BaseModel):
    """A sweep's language-model spend (every call, including those no experiment carries)."""

    tokens_in: int
    tokens_out: int
    usd: float

    @classmethod
    def of(cls, usage: tuple[int, int, float]) -> LLMSpend:
        return cls(tokens_in=usage[0], tokens_out=usage[1], usd=round(usage[2], 6))


class SecondaryValue(BaseModel):
    """One `[target] secondary` key of an experiment (agent.analysis.secondary)."""

    mean: float | None = Field(description="measured: the mean of the runs `metric` rests on "
                               "that printed the key; null when none of them did")
    n: int = Field(description="how many of those runs printed it")


class RunView(BaseModel):
    """One run of an experiment (its own, or the incumbent's recorded under it)."""

    id: int
    role: str = Field(description="baseline | screen | confirm | incumbent")
    seed: int
    status: str = Field(description="running | ok | suspect (set aside: in no value, it ran at "
                        "another machine speed) | failed | timeout | cancelled | "
                        "interrupted | pruned (stopped early: behind the incumbent)")
    metric: float | None
    training_seconds: float | None
    throughput: float | None
    throughput_unit: str | None
    stop_reason: str | None = Field(description="a pruned run: why it was stopped early")
    note: str | None = Field(description="how the keep rule placed it (why it was set aside)")
    slurm_job_id: str | None = Field(None, description="the Slurm job that ran it (executor "
                                     "slurm; the same job on a run that adopted it after a "
                                     "restart)")
    pair_run_id: int | None = Field(None, description="an incumbent run started beside a "
                                    "change's run (in the same machine conditions): that run")
    secondary: dict[str, float | None] | None = Field(
        None, description="this run's own value of each `[target] secondary` key (null: it "
        "printed none); null when the target names no key")

    @classmethod
    def of(cls, r: Run, keys: Sequence[str] = ()) -> RunView:
        pruned = r.status is RunStatus.PRUNED
        return cls(id=r.id, role=r.role.value, seed=r.seed, status=r.status.value,
                   metric=r.metric, training_seconds=r.training_s, throughput=r.throughput,
                   throughput_unit=r.throughput_unit, stop_reason=r.note if pruned else None,
                   note=None if pruned else r.note, slurm_job_id=r.slurm_job_id,
                   pair_run_id=r.pair_run_id,
                   secondary={k: run_value(r.summary or {}, k) for k in keys} if keys else None)


class ExperimentView(BaseModel):
    id: int
    sweep: str
    status: str
    crash_kind: str | None
    crash_cause: str | None = Field(description="the fine cause of a crash, e.g. \"CUDA out of "
                                    "memory\", as classification named it")
    description: str
    diff: str | None = Field(None, description="only when one experiment is asked for")
    metric: float | None = Field(description="measured: the mean of the runs its value rests "
                                 "on (meta.verdict.change names them)")
    n: int = Field(0, description="how many runs `metric` is the mean of")
    secondary: dict[str, SecondaryValue] | None = Field(
        None, description="each `[target] secondary` key (peak_vram_mb, tokens_per_s …): its "
        "mean over the runs `metric` rests on that printed it, and how many did; never read by "
        "the keep rule; null when the target names no key, and in the answer to a POST (a "
        "queued experiment: no run yet)")
    delta: float | None = Field(description="inferred: its difference from the incumbent runs "
                                "it was compared with (meta.verdict.incumbent), within machine "
                                "conditions, signed as the metric (change − incumbent)")
    delta_se: float | None = Field(None, description="the standard error of `delta` (on σ̂)")
    best_before: float | None = Field(description="the best when it was decided "
                                      "(meta.verdict.best: a mean of the best commit's runs)")
    commit: str | None
    ref: str | None
    parent_id: int | None
    attempt: int
    is_baseline: bool
    priority: int
    proposer: str
    reason: str | None
    summary: dict[str, Any]
    memory_gb: float
    training_seconds: float | None
    warnings: list[str] = Field(description="contract problems of its run (budget ignored …)")
    llm: LLMView | None = Field(description="a language model's conversation, errors and "
                                "tokens for this proposal (null for other proposers)")
    meta: dict[str, Any]
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    log_path: str | None
    run_records: list[RunView] | None = Field(None, description="each run recorded under it, "
                                              "oldest first (one experiment, and results json)")

    @classmethod
    def fields_of(cls, e: Experiment, sweep_name: str, with_diff: bool = False,
                  with_conversation: bool | None = None,
                  runs: Sequence[Run] | None = None, keys: Sequence[str] = (),
                  secondary: Sequence[SecondaryMean] | None = None) -> dict[str, Any]:
        """The projection's values, for models that extend it. The diff and a language model's
        conversation come with one experiment (with_diff), not in lists; its runs when given.
        `secondary`: its `[target] secondary` keys' means when read already (a list's, by
        agent.analysis.secondary); else with the sweep's `keys` they are computed from `runs`
        (none given: a queued experiment's, no run yet); with `keys` each run's own value."""
        talk = with_diff if with_conversation is None else with_conversation
        if keys and secondary is None:
            secondary = secondary_means(e.record, runs or (), keys)
        seconds = e.summary.get("training_seconds")
        return dict(
            id=e.id, sweep=sweep_name, status=e.status.value,
            crash_kind=e.crash_kind.value if e.crash_kind else None, crash_cause=e.crash_cause,
            description=e.description,
            diff=e.diff if with_diff else None, metric=e.metric,
            n=e.record.n if e.record is not None else 0,
            secondary=None if secondary is None else {
                m.key: SecondaryValue(mean=m.mean, n=m.n) for m in secondary},
            delta=e.delta,
            delta_se=e.record.se if e.record is not None else None, best_before=e.best_before,
            commit=e.commit, ref=e.ref, parent_id=e.parent_id,
            attempt=e.attempt, is_baseline=e.is_baseline, priority=e.priority,
            proposer=e.proposer, reason=e.reason, summary=e.summary, memory_gb=memory_gb(e),
            training_seconds=float(seconds) if isinstance(seconds, int | float) else None,
            warnings=[str(w) for w in e.meta.get("warnings", [])], llm=LLMView.of(e.meta, talk),
            meta={k: v for k, v in e.meta.items() if k != CONVERSATION_KEY},
            created_at=e.created_at, started_at=e.started_at, finished_at=e.finished_at,
            log_path=e.log_path,
            run_records=None if runs is None else [RunView.of(r, keys) for r in runs],
        )

    @classmethod
    def of(cls, e: Experiment, sweep_name: str, with_diff: bool = False,
           with_conversation: bool | None = None,
           runs: Sequence[Run] | None = None, keys: Sequence[str] = (),
           secondary: Sequence[SecondaryMean] | None = None) -> ExperimentView:
        return cls(**cls.fields_of(e, sweep_name, with_diff, with_conversation, runs, keys,
                                   secondary))
