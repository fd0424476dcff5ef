"""What a tracker is told about a sweep and each of its experiments, made from the records.

Pure: a sweep becomes a SweepRecord (the parent run: its settings as params, its name,
status and link as tags, the night's numbers as its summary) and each finished experiment an
ExperimentRecord (a child run): the change's description and the knob values it sets as
params; each of its own runs' metric with the run's seed as the step; the verdict as the
dashboard shows it (the recorded mean, the 95 % interval and P(better) of the evidence, the
delta, n); commit, parent commit, status, crash class, proposer, sweep and the link to its
page as tags; the diff and the run logs as artifacts. Both trackers write these, and
`verdict` is what is compared to tell whether a mirrored verdict moved since. A tracker call
that fails raises TrackerError, the one error both trackers raise.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from agent.analysis.evidence import ExperimentEvidence, SweepEvidence
from agent.analysis.trials import constant_changes
from agent.core.domain import Experiment, ExperimentStatus, Run, RunRole, Sweep

S = ExperimentStatus
TAG = "overnight."  # the prefix of every tag overnight writes
PARAM_MAX = 500  # a param value's length at most (MLflow's limit is higher; W&B has none)
# How a finished experiment ends as a tracker's run (MLflow's run statuses; W&B's exit code).
RUN_END = {S.KEPT: "FINISHED", S.DISCARDED: "FINISHED", S.CRASHED: "FAILED",
           S.TIMEOUT: "FAILED", S.REJECTED: "FAILED", S.CANCELLED: "KILLED",
           S.INTERRUPTED: "KILLED"}


class TrackerError(Exception):
    """A tracker call that failed; `retry`: worth trying again (the tracker is down or slow,
    not refusing what it was sent)."""

    def __init__(self, why: str, retry: bool = True) -> None:
        super().__init__(why)
        self.retry = retry


@dataclass(frozen=True)
class Point:
    """One run's metric: its seed as the step, when it ended."""

    key: str
    value: float
    step: int
    at: datetime | None = None


@dataclass(frozen=True)
class ExperimentRecord:
    experiment_id: int
    name: str
    params: dict[str, str]
    points: tuple[Point, ...]
    verdict: dict[str, float]
    tags: dict[str, str]
    end: str  # FINISHED | FAILED | KILLED
    started_at: datetime | None
    finished_at: datetime | None
    diff: str
    logs: tuple[Path, ...] = ()  # the run logs still on disk


@dataclass(frozen=True)
class SweepRecord:
    key: str  # stable and unique to this sweep of this database: the trackers' run ids
    name: str
    params: dict[str, str]
    tags: dict[str, str]
    summary: dict[str, float] = field(default_factory=dict)
    finished: bool = False
    started_at: datetime | None = None


def sweep_key(sweep: Sweep) -> str:
    """A name for the sweep that another sweep of the same name (another database, or one
    made again) does not share: its name and a hash of its creation time."""
    digest = hashlib.sha1(f"{sweep.name}\0{sweep.created_at.isoformat()}".encode())
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in sweep.name)[:40]
    return f"{safe}-{digest.hexdigest()[:8]}"


def _number(value: float | int | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def sweep_record(sweep: Sweep, ev: SweepEvidence, base_url: str) -> SweepRecord:
    c = sweep.config
    params = {"target": sweep.target_path, "metric": c.metric, "direction": c.direction,
              "budget_s": f"{c.budget_s:g}", "timeout_s": f"{c.timeout_s:g}",
              "proposer": sweep.proposer, "branch": sweep.branch, "decision": c.decision,
              "max_experiments": str(sweep.max_experiments)}
    tags = {f"{TAG}sweep": sweep.name, f"{TAG}sweep_key": sweep_key(sweep),
            f"{TAG}status": sweep.status.value, f"{TAG}branch": sweep.branch,
            f"{TAG}link": f"{base_url}/ui/sweeps/{sweep.name}",
            f"{TAG}statement": ev.statement()}
    numbers = {f"{c.metric}_baseline": sweep.baseline_metric, f"{c.metric}_best":
               sweep.best_metric, "improvement": ev.improvement,
               "improvement_ci95": ev.improvement_ci, "sigma": ev.sigma,
               "kept": ev.kept, "kept_supported": ev.supported}
    summary = {k: v for k, v in ((k, _number(v)) for k, v in numbers.items()) if v is not None}
    return SweepRecord(sweep_key(sweep), sweep.name, params, tags, summary,
                       sweep.status.is_finished(), sweep.created_at)


def knob_values(exp: Experiment) -> dict[str, str]:
    """The knob values a change sets: the knobs proposer's own account of its move (any file
    shape: a constant, a flag, a config key), else the constants its diff changes."""
    meta = exp.meta
    moves = meta.get("changes") if isinstance(meta.get("changes"), list) else None
    if moves is None and isinstance(meta.get("knob"), str) and "new" in meta:
        moves = [{"knob": meta["knob"], "new": meta["new"]}]
    if moves:
        return {str(m["knob"]): str(m.get("new")) for m in moves
                if isinstance(m, dict) and "knob" in m}
    changes, _ = constant_changes(exp.diff)
    return {ch.name: ch.new for ch in changes}


def verdict(sweep: Sweep, exp: Experiment, ev: ExperimentEvidence | None) -> dict[str, float]:
    """The verdict as the dashboard's table shows it: the mean of the runs its value rests on
    and their n (measured), its interval, P(better), and its difference from the incumbent runs
    it was compared with ± se (inferred)."""
    m = sweep.metric
    record = exp.record
    numbers = {f"{m}_mean": exp.metric, f"{m}_ci95": ev.ci if ev else None,
               "p_better": ev.p_better if ev else None, f"{m}_delta": exp.delta,
               f"{m}_delta_se": record.se if record is not None else None,
               "runs": ev.n if ev else 0}
    return {k: v for k, v in ((k, _number(v)) for k, v in numbers.items()) if v is not None}


def own_runs(runs: Sequence[Run]) -> list[Run]:
    """The runs of the experiment's own commit (not the incumbent's re-runs recorded with
    it), in seed order."""
    return sorted((r for r in runs if r.role is not RunRole.INCUMBENT),
                  key=lambda r: (r.seed, r.id))


def experiment_record(sweep: Sweep, exp: Experiment, runs: Sequence[Run],
                      ev: ExperimentEvidence | None, base_url: str) -> ExperimentRecord:
    mine = own_runs(runs)
    points = tuple(Point(sweep.metric, float(r.metric), r.seed, r.ended_at) for r in mine
                   if r.metric is not None and math.isfinite(r.metric))
    params = {"description": exp.description[:PARAM_MAX],
              **{k: v[:PARAM_MAX] for k, v in knob_values(exp).items()}}
    tags = {f"{TAG}sweep": sweep.name, f"{TAG}sweep_key": sweep_key(sweep),
            f"{TAG}experiment": str(exp.id), f"{TAG}status": exp.status.value,
            f"{TAG}proposer": exp.proposer, f"{TAG}link": f"{base_url}/ui/experiments/{exp.id}",
            f"{TAG}baseline": str(exp.is_baseline).lower()}
    optional = {"commit": exp.commit, "parent_commit": exp.base_commit,
                "crash_class": exp.crash_kind.value if exp.crash_kind else None,
                "crash_cause": exp.crash_cause, "reason": (exp.reason or "")[:PARAM_MAX] or None}
    tags.update({f"{TAG}{k}": v for k, v in optional.items() if v})
    logs = []
    for path in dict.fromkeys([*(r.log_path for r in mine), exp.log_path]):
        if path and Path(path).is_file():
            logs.append(Path(path))
    name = "baseline" if exp.is_baseline else exp.description
    return ExperimentRecord(exp.id, f"#{exp.id} {name}"[:250], params, points,
                            verdict(sweep, exp, ev), tags, RUN_END.get(exp.status, "FINISHED"),
                            exp.started_at or exp.created_at, exp.finished_at, exp.diff,
                            tuple(logs))
