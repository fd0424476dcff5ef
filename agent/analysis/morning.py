"""The morning report of one sweep as one model: the headline, the kept changes with their
evidence and diff stat, what was learned, crashes by kind and cause, cost, the attribution of an
ablation and what to try next. `overnight report` renders it as Markdown (morning_md) or as one
self-contained HTML page (api.dashboard.report_html); the dashboard and MCP show the same.

Pure: built from the records (a Sweep, its experiments and runs, its LLM usage) by
`build_report`; agent.ops.morning reads them from the store. Nothing here is worked out twice:
the evidence is agent.analysis.evidence's, the digest agent.analysis.insights', the attribution
agent.analysis.ablation's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from agent.analysis.ablation import Attribution
from agent.analysis.evidence import SweepEvidence, recorded_value, sweep_evidence
from agent.analysis.insights import sections
from agent.analysis.insights_fold import digest
from agent.analysis.morning_model import (
    INCUMBENT_BUCKET,
    Cost,
    CostLine,
    CrashGroup,
    Headline,
    KeptChange,
    Report,
)
from agent.analysis.morning_next import next_steps
from agent.core.diff import diff_stats, parse
from agent.core.domain import (
    RAN_STATUSES,
    TEST_KEY,
    Experiment,
    ExperimentStatus,
    Run,
    RunRole,
    RunStatus,
    Sweep,
)
from agent.core.errors import AdmissionError

S = ExperimentStatus
MAX_CRASH_IDS = 6


def build_report(sweep: Sweep, experiments: Sequence[Experiment], runs: Sequence[Run],
                 llm_usage: tuple[int, int, float] = (0, 0, 0.0), now: datetime | None = None,
                 attribution: Attribution | None = None, seeds: int = 3) -> Report:
    """The report of `sweep` from its records (experiments and runs oldest first)."""
    exps = list(experiments)
    ev = sweep_evidence(sweep, exps, list(runs))
    ins = digest(sweep, exps)
    kept = [kept_change(e, ev) for e in exps if e.status is S.KEPT and not e.is_baseline]
    finished = [e.finished_at for e in exps if e.finished_at is not None]
    headline = headline_of(sweep, ev, runs, exps)
    report = Report(
        sweep=sweep.name, status=sweep.status.value, target=sweep.target_path,
        branch=sweep.branch, proposer=sweep.proposer, budget_s=sweep.budget_s,
        created_at=sweep.created_at, last_finish=max(finished) if finished else None,
        counts=dict(Counter(e.status.value for e in exps)), headline=headline, kept=kept,
        learned=[(h, lines) for h, lines in sections(ins)[1:] if lines], plateau=ins.plateau,
        crashes=crash_groups(exps), cost=cost_of(exps, runs, llm_usage, now),
        next_steps=[], attribution=attribution,
        experiments=tuple(e for e in exps if e.status in RAN_STATUSES), evidence=ev,
        ablation_cost=ablation_runs(len(kept), seeds))
    return replace(report, next_steps=next_steps(report, ins))


def ablation_runs(kept: int, seeds: int) -> int:
    """Runs `finalize --ablate` takes: k seeds of the best, the baseline and the best minus each
    kept change (with one change, minus it is the baseline)."""
    if not kept:
        return 0
    return (kept + 2 if kept > 1 else 2) * seeds


def headline_of(sweep: Sweep, ev: SweepEvidence, runs: Sequence[Run],
                exps: Sequence[Experiment]) -> Headline:
    """The baseline and the best as the keep rule records them (the sweep's, from agent.rules.
    conditions.recorded_best) on their runs in their usual machine conditions."""
    base = next((e for e in exps if e.is_baseline and e.commit), None)
    base_value, base_n = recorded_value(runs, base.commit if base else None)
    value, best_n = recorded_value(runs, sweep.best_commit)
    baseline = sweep.baseline_metric if sweep.baseline_metric is not None else base_value
    best = sweep.best_metric if sweep.best_metric is not None else value
    rel = (ev.improvement / abs(baseline) if ev.improvement is not None and baseline
           else None)
    return Headline(sweep.metric, sweep.direction.value, baseline, base_n, best,
                    best_n, ev.improvement, ev.improvement_ci, rel, ev.kept,
                    ev.supported, ev.sigma, ev.statement(),
                    sum(r.status is RunStatus.SUSPECT for r in runs))


def kept_change(e: Experiment, ev: SweepEvidence) -> KeptChange:
    one = ev.experiments.get(e.id)
    added, removed = diff_stats(e.diff)
    try:
        files = tuple(dict.fromkeys(p.path for p in parse(e.diff)))
    except AdmissionError:
        files = ()
    p = one.p_better if one else None
    return KeptChange(
        id=e.id, description=e.description, commit=(e.commit or "")[:7],
        mean=e.metric, ci=one.ci if one else None, n=one.n if one else 0,
        p_better=p, delta=e.delta, added=added, removed=removed, files=files,
        proposer=e.proposer, reason=e.reason or "",
        supported=isinstance(e.meta.get(TEST_KEY), dict) and "p" in e.meta[TEST_KEY],
        now=one.remeasured(e.metric) if one else "")


def crash_groups(exps: Sequence[Experiment]) -> list[CrashGroup]:
    """Crashed and timed-out experiments by (status, kind, cause), most frequent first."""
    groups: dict[tuple[str, str, str], list[Experiment]] = {}
    for e in exps:
        if e.status not in (S.CRASHED, S.TIMEOUT):
            continue
        kind = e.crash_kind.value if e.crash_kind else ("timeout" if e.status is S.TIMEOUT
                                                        else "unclassified")
        cause = e.crash_cause or _first_line(e.reason) or "unknown"
        groups.setdefault((e.status.value, kind, cause), []).append(e)
    out = [CrashGroup(status, kind, cause, len(es), tuple(x.id for x in es[:MAX_CRASH_IDS]),
                      _first_line(es[0].reason))
           for (status, kind, cause), es in groups.items()]
    return sorted(out, key=lambda g: (-g.count, g.status, g.kind, g.cause))


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:200] if (text or "").strip() else ""


def cost_of(exps: Sequence[Experiment], runs: Sequence[Run],
            llm_usage: tuple[int, int, float], now: datetime | None) -> Cost:
    """Wall hours of every run (start to end; a running one until `now`), by the status of the
    experiment it ran for; the baseline's and the re-runs of the best on their own lines."""
    status = {e.id: "baseline" if e.is_baseline else e.status.value for e in exps}
    hours: dict[str, float] = {}
    counted: Counter[str] = Counter()
    for r in runs:
        end = r.ended_at or now
        if r.started_at is None or end is None:
            continue
        bucket = INCUMBENT_BUCKET if r.role is RunRole.INCUMBENT else status.get(
            r.experiment_id, "unknown")
        hours[bucket] = hours.get(bucket, 0.0) + max(
            0.0, (end - r.started_at).total_seconds()) / 3600
        counted[bucket] += 1
    order = ["baseline", *(s.value for s in ExperimentStatus), INCUMBENT_BUCKET, "unknown"]
    lines = [CostLine(b, counted[b], hours[b]) for b in order if counted[b]]
    devices = tuple(sorted({r.device for r in runs if r.device}))
    return Cost(lines, sum(hours.values()), sum(counted.values()), devices, *llm_usage)
