"""Request and response models: the `…Create` / `…Public` / `{data, count}` family."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from agent.analysis.projection import ExperimentView, LLMSpend
from agent.core.budget import ComputeBudget, parse_budget
from agent.core.domain import Sweep
from agent.rules.gate import parse_hhmm

T = TypeVar("T")
MAX_LIMIT = 200


class Window(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start: str = Field(examples=["22:00"], description="HH:MM, server local time")
    stop: str = Field(examples=["07:00"], description="HH:MM; may wrap past midnight")

    @field_validator("start", "stop")
    @classmethod
    def _hhmm(cls, v: str) -> str:
        parse_hhmm(v)
        return v


class SweepCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, examples=["mar8"])
    target: str = Field(min_length=1, description="path of the target git repository on the "
                        "server (it must hold overnight.toml)")
    budget_s: float | None = Field(None, gt=0, le=86400, description="training seconds per run")
    budget: str | None = Field(None, max_length=40, examples=["600 steps", "2M tokens"],
                               description="each run's budget as text, in place of budget_s: "
                               "seconds (\"300 s\") or a compute budget (\"600 steps\", "
                               "\"2M tokens\"), for a machine shared with other jobs")
    timeout_s: float | None = Field(None, gt=0, le=4 * 86400)
    max_experiments: int | None = Field(None, ge=0, le=100_000)
    deadline: AwareDatetime | None = None
    window: Window | None = None
    proposer: str = Field("knobs", max_length=100, description="knobs | queue | llm:<profile>")
    start_at: AwareDatetime | None = Field(None, description="start paused; resume at this time "
                                           "(persists across restarts)")
    paused: bool = False
    allow_dirty: bool = Field(False, description="run the committed HEAD although the target's "
                              "checkout has uncommitted changes (refused otherwise)")

    @field_validator("budget")
    @classmethod
    def _budget(cls, v: str | None) -> str | None:
        if v is not None:
            given = parse_budget(v)  # a ValueError names what is accepted
            if isinstance(given, float) and given > 86400:
                raise ValueError(f"at most 86400 seconds, got {v!r}")
        return v

    @model_validator(mode="after")
    def _one_budget(self) -> SweepCreate:
        if self.budget is not None and self.budget_s is not None:
            raise ValueError("give budget_s or budget, not both")
        return self

    def run_budget(self) -> float | ComputeBudget | None:
        """Each run's budget as given: seconds, a compute budget, or None (the target's)."""
        return parse_budget(self.budget) if self.budget is not None else self.budget_s


class SweepPublic(BaseModel):
    id: int
    name: str
    status: str
    target: str
    branch: str
    proposer: str
    metric: str
    direction: str
    budget: str = Field(description="each run's training budget as a person reads it: "
                        "\"300 s\", or a compute budget, \"600 steps\"")
    budget_s: float | None = Field(description="the budget in seconds; null on a compute "
                                   "budget (runs train a fixed number of steps or tokens)")
    timeout_s: float
    max_experiments: int | None
    deadline: datetime | None
    window: dict[str, str] | None
    baseline_metric: float | None
    best_metric: float | None
    best_commit: str | None
    best_experiment_id: int | None
    created_at: datetime
    counts: dict[str, int] = Field(default_factory=dict)
    scheduled_start: datetime | None = None
    llm: LLMSpend | None = Field(None, description="language-model tokens and dollars spent "
                                 "on the sweep")

    @classmethod
    def of(cls, s: Sweep, counts: dict[str, int] | None = None,
           scheduled_start: datetime | None = None, llm: LLMSpend | None = None
           ) -> SweepPublic:
        return cls(
            id=s.id, name=s.name, status=s.status.value, target=s.target_path, branch=s.branch,
            proposer=s.proposer, metric=s.metric, direction=s.direction.value,
            budget=s.config.budget_text,
            budget_s=s.budget_s if s.config.time_budget else None, timeout_s=s.timeout_s,
            max_experiments=s.max_experiments,
            deadline=s.deadline, window=s.window, baseline_metric=s.baseline_metric,
            best_metric=s.best_metric, best_commit=s.best_commit,
            best_experiment_id=s.best_experiment_id, created_at=s.created_at,
            counts=counts or {}, scheduled_start=scheduled_start, llm=llm,
        )


class ExperimentCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sweep: str = Field(min_length=1, max_length=64)
    description: str = Field(min_length=1, max_length=2000, examples=["halve batch size"])
    diff: str = Field(min_length=1, description="unified diff against the sweep head")
    priority: int = Field(0, ge=-1000, le=1000, description="higher runs first (FIFO within)")


ExperimentPublic = ExperimentView  # the one projection (agent.analysis.projection)


class Page(BaseModel, Generic[T]):
    data: list[T]
    count: int | None = Field(description="matching records in total (all pages); null for "
                              "a time-filtered list, which is not counted")
    next_cursor: int | None = Field(None, description="pass as ?cursor= for the next page")


class KeptChange(BaseModel):
    id: int
    description: str
    metric: float | None = Field(description="measured: the mean of the runs its value rests on")
    n: int = Field(0, description="how many runs `metric` is the mean of")
    delta: float | None = Field(description="inferred: its difference from the incumbent runs "
                                "it was compared with, signed as the metric")
    delta_se: float | None = Field(None, description="the standard error of `delta`")
    commit: str | None
    diff: str


class BestPublic(BaseModel):
    sweep: str
    metric_name: str
    metric: float | None
    baseline_metric: float | None
    commit: str | None
    experiment_id: int | None
    files: dict[str, str] = Field(description="each editable file at the best commit")
    kept: list[KeptChange] = Field(description="the stack of kept diffs, oldest first")


class CancelPublic(BaseModel):
    experiment: ExperimentPublic
    pending: bool = Field(description="true: a running experiment was asked to stop")


class HealthPublic(BaseModel):
    status: str
    db: str
    scheduler: str  # running | stopped | disabled
    slots: int
    busy: int
    running: list[int]
    queue_depth: int
    retired_slots: dict[int, str] = {}  # slot -> why its device was taken out of service
    # Writes fail for lack of space since then (db says why): the engine holds its work and
    # goes on by itself once they succeed (None: they succeed).
    writes_failing_since: datetime | None = None
    version: str = "0.1.0"


class InsightsPublic(BaseModel):
    """The sweep's digest (agent.analysis.insights): as text for a model, and structured."""

    sweep: str
    text: str
    data: dict[str, Any]
