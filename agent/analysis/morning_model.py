"""The morning report's model: one sweep's headline, kept changes, crashes, cost and advice as
plain frozen dataclasses (built by agent.analysis.morning, rendered by agent.analysis.morning_md
and api.dashboard.report_html). Pure: stdlib and the analysis wing's own types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from agent.analysis.ablation import Attribution
from agent.analysis.confirm import Confirmation
from agent.analysis.evidence import SweepEvidence
from agent.core.domain import Experiment

INCUMBENT_BUCKET = "incumbent re-runs"  # cost of re-measuring the best, apart from the changes


@dataclass(frozen=True)
class Headline:
    metric: str
    direction: str
    baseline: float | None  # the baseline as the keep rule records it (the sweep's)
    baseline_n: int  # its runs in its usual machine condition
    best: float | None  # the best as the keep rule records it (the sweep's)
    best_n: int
    improvement: float | None  # better = positive
    improvement_ci: float | None
    relative: float | None  # improvement / |baseline|
    kept: int
    supported: int  # kept by the test (the others: one run each, the noise not measured)
    sigma: float | None
    statement: str  # evidence's honest line
    set_aside: int = 0  # runs marked suspect (they measured the machine): in no mean

    def text(self) -> str:
        """One line for a chat message or a notification."""
        if self.baseline is None:
            return f"{self.metric}: no baseline yet; {self.statement}"
        best = self.best if self.best is not None else self.baseline
        gain = ""
        if self.improvement is not None:
            ci = f" ± {self.improvement_ci:.3g}" if self.improvement_ci is not None else ""
            rel = f", {self.relative:+.2%}" if self.relative is not None else ""
            gain = f" (gain {self.improvement:+.4g}{ci}{rel})"
        return (f"{self.metric} {self.baseline:.6g} → {best:.6g}{gain}; {self.statement}")


@dataclass(frozen=True)
class KeptChange:
    id: int
    description: str
    commit: str
    mean: float | None  # its value as the keep rule decided it (the experiment's metric)
    ci: float | None
    n: int
    p_better: float | None
    delta: float | None  # metric − best before it (signed as the metric)
    added: int
    removed: int
    files: tuple[str, ...]
    proposer: str
    reason: str
    supported: bool
    now: str = ""  # "kept at 3.309 on 2 runs; now 3.256 on 3" when measured again since


@dataclass(frozen=True)
class CrashGroup:
    status: str  # crashed | timeout
    kind: str  # trivial | fundamental | timeout
    cause: str
    count: int
    ids: tuple[int, ...]  # the first few
    example: str  # the first line of one reason


@dataclass(frozen=True)
class CostLine:
    status: str  # the experiment's status, or INCUMBENT_BUCKET
    runs: int
    hours: float


@dataclass(frozen=True)
class Cost:
    lines: list[CostLine]
    hours: float
    runs: int
    devices: tuple[str, ...]  # what the runs ran on, as recorded (empty: not recorded)
    llm_tokens_in: int
    llm_tokens_out: int
    llm_usd: float

    @property
    def unit(self) -> str:
        """"GPU-hours" when every run held a GPU (a CUDA device recorded), else "Run hours"."""
        gpu = bool(self.devices) and all(d.startswith("cuda") for d in self.devices)
        return "GPU-hours" if gpu else "Run hours"


@dataclass(frozen=True)
class HoldoutRow:
    """One commit's validation metric and sealed holdout metric, means of its good runs."""

    label: str  # "baseline" | "best"
    commit: str
    validation: float | None
    validation_n: int
    holdout: float | None
    holdout_n: int


@dataclass(frozen=True)
class Holdout:
    """Validation vs the sealed holdout (TargetConfig.holdout_metric), shown after the night."""

    metric: str
    holdout_metric: str
    rows: tuple[HoldoutRow, ...]
    sealed: bool = False  # the sweep still runs: the holdout stays unread


@dataclass(frozen=True)
class Report:
    sweep: str
    status: str
    target: str
    branch: str
    proposer: str
    budget_s: float
    created_at: datetime
    last_finish: datetime | None
    counts: dict[str, int]  # experiments by status (the baseline included)
    headline: Headline
    kept: list[KeptChange]
    learned: list[tuple[str, list[str]]]  # the digest's sections after its headline
    plateau: str
    crashes: list[CrashGroup]
    cost: Cost
    next_steps: list[str]
    attribution: Attribution | None = None
    # For the HTML page's plot (the same records, drawn): the sweep's finished runs and evidence.
    experiments: tuple[Experiment, ...] = field(default=(), repr=False)
    evidence: SweepEvidence | None = field(default=None, repr=False)
    ablation_cost: int = 0  # runs an ablation of this sweep would take (k seeds each)
    confirmation: Confirmation | None = None  # `overnight confirm`: the gain at a larger setting
    holdout: Holdout | None = None  # a target with a holdout_metric: validation vs holdout
