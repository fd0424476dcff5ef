"""The morning report of one sweep as one model: the headline, the kept changes with their
evidence and diff stat, what was learned, crashes by kind and cause, cost, the attribution of an
ablation and what to try next. `overnight report` renders it as Markdown (morning_md) or as one
self-contained HTML page (api.dashboard.report_html); the dashboard and MCP show the same.

Pure: built from the records (a Sweep, its experiments and runs, its LLM usage) by
`build_report` as plain frozen dataclasses; agent.ops.morning reads them from the store. Nothing
here is worked out twice: the evidence is agent.analysis.evidence's, the digest
agent.analysis.insights', the attribution agent.analysis.ablation's.

What to try next is read off the report and the sweep's digest: a few plain sentences, most
pressing first (the attribution's flags, weak keeps, a gain inside the noise, near-misses,
promising directions, the plateau, crash regions). Two checks reach beyond the night: does the
gain hold at a larger setting (`overnight confirm`), and validation vs the sealed holdout metric
(built from the runs).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from agent.analysis.ablation import HELPS, UNMEASURED, Attribution
from agent.analysis.confirm import FLIPS, SHRINKS, Confirmation
from agent.analysis.counts import Counts
from agent.analysis.evidence import SweepEvidence, recorded_value, sweep_evidence
from agent.analysis.insights import Insights, sections
from agent.analysis.insights_fold import digest
from agent.analysis.secondary import SecondaryMean, by_experiment
from agent.analysis.trials import PLATEAU_AFTER
from agent.analysis.words import weighed
from agent.core.config import Direction
from agent.core.diff import diff_stats, parse
from agent.core.domain import (
    RAN_STATUSES,
    Experiment,
    ExperimentStatus,
    Run,
    RunRole,
    RunStatus,
    Sweep,
)
from agent.core.errors import AdmissionError

# --- the model --------------------------------------------------------------------------------
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
            gain = f" (gain {self.improvement + 0.0:+.6f}{ci}{rel})"
        return (f"{self.metric} {self.baseline:.6f} → {best:.6f}{gain}; {self.statement}")


@dataclass(frozen=True)
class KeptChange:
    id: int
    description: str
    commit: str
    mean: float | None  # measured: the mean of the runs its record names (its metric)
    ci: float | None
    n: int
    p_better: float | None
    delta: float | None  # inferred: its difference from the incumbent runs it was compared
    se: float | None  # with (signed as the metric), and that difference's standard error
    added: int
    removed: int
    files: tuple[str, ...]
    proposer: str
    reason: str
    supported: bool
    now: str = ""  # "kept at 3.309 on 2 runs; now 3.256 on 3" when measured again since
    # each `[target] secondary` key's mean over the same runs as `mean` (measured)
    secondary: tuple[SecondaryMean, ...] = ()
    weighed: str = ""  # what it weighed besides the metric (agent.analysis.words.weighed)


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
    budget_text: str  # "300 s" or a compute budget's "600 steps"
    created_at: datetime
    last_finish: datetime | None
    counts: dict[str, int]  # experiments by status (the baseline's row included)
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
    night: Counts = field(default_factory=lambda: Counts(0, 0, 0, 0, 0))  # every screen's
    confirmation: Confirmation | None = None  # `overnight confirm`: the gain at a larger setting
    holdout: Holdout | None = None  # a target with a holdout_metric: validation vs holdout
    secondary: tuple[str, ...] = ()  # the target's `[target] secondary` keys (each kept row's)


# --- the report built from the records --------------------------------------------------------
S = ExperimentStatus
MAX_CRASH_IDS = 6


def build_report(sweep: Sweep, experiments: Sequence[Experiment], runs: Sequence[Run],
                 llm_usage: tuple[int, int, float] = (0, 0, 0.0), now: datetime | None = None,
                 attribution: Attribution | None = None, seeds: int = 3) -> Report:
    """The report of `sweep` from its records (experiments and runs oldest first)."""
    exps = list(experiments)
    ev = sweep_evidence(sweep, exps, list(runs))
    ins = digest(sweep, exps)
    changes = [e for e in exps if e.status is S.KEPT and not e.is_baseline]
    keys = sweep.config.secondary
    secondary = by_experiment(changes, runs, keys)
    kept = [kept_change(e, ev, secondary.get(e.id, ()), sweep.config.simplicity_margin,
                        sweep.direction is Direction.MINIMIZE) for e in changes]
    finished = [e.finished_at for e in exps if e.finished_at is not None]
    headline = headline_of(sweep, ev, runs, exps)
    report = Report(
        sweep=sweep.name, status=sweep.status.value, target=sweep.target_path,
        branch=sweep.branch, proposer=sweep.proposer, budget_s=sweep.budget_s,
        budget_text=sweep.config.budget_text,
        created_at=sweep.created_at, last_finish=max(finished) if finished else None,
        counts=dict(Counter(e.status.value for e in exps)), headline=headline, kept=kept,
        learned=[(h, lines) for h, lines in sections(ins)[1:] if lines], plateau=ins.plateau,
        crashes=crash_groups(exps), cost=cost_of(exps, runs, llm_usage, now),
        next_steps=[], attribution=attribution,
        experiments=tuple(e for e in exps if e.status in RAN_STATUSES), evidence=ev,
        ablation_cost=ablation_runs(len(kept), seeds), night=Counts.of_records(exps, runs),
        secondary=keys)
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
    by_time = sweep.config.time_budget
    base_value, base_n = recorded_value(runs, base.commit if base else None, by_time)
    value, best_n = recorded_value(runs, sweep.best_commit, by_time)
    baseline = sweep.baseline_metric if sweep.baseline_metric is not None else base_value
    best = sweep.best_metric if sweep.best_metric is not None else value
    rel = (ev.improvement / abs(baseline) if ev.improvement is not None and baseline
           else None)
    return Headline(sweep.metric, sweep.direction.value, baseline, base_n, best,
                    best_n, ev.improvement, ev.improvement_ci, rel, ev.kept,
                    ev.supported, ev.sigma, ev.statement(),
                    sum(r.status is RunStatus.SUSPECT for r in runs))


def kept_change(e: Experiment, ev: SweepEvidence,
                secondary: tuple[SecondaryMean, ...] = (), simplicity_margin: float = 0.0,
                minimize: bool = True) -> KeptChange:
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
        p_better=p, delta=e.delta, se=e.record.se if e.record is not None else None,
        added=added, removed=removed, files=files, proposer=e.proposer, reason=e.reason or "",
        supported=e.record is not None and e.record.tested,
        now=one.remeasured_text(e.metric) if one else "", secondary=secondary,
        weighed=weighed(e.record, simplicity_margin, minimize))


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


# --- what to try next -------------------------------------------------------------------------
MAX_STEPS = 8
MAX_DIRECTIONS = 2


def next_steps(report: Report, ins: Insights) -> list[str]:
    """At most MAX_STEPS suggestions for the next night."""
    steps = [*_from_attribution(report), *_from_evidence(report), *_from_digest(ins),
             *_from_crashes(report)]
    if not steps:
        steps.append("nothing stands out: another night with the same search, or a bigger "
                     "budget to tell smaller effects apart")
    return steps[:MAX_STEPS]


def _from_attribution(report: Report) -> list[str]:
    a = report.attribution
    if a is None:
        if len(report.kept) >= 2:
            return [f"attribute the gain to each kept change: `overnight finalize --sweep "
                    f"{report.sweep} --ablate` ({report.ablation_cost} runs)"]
        return []
    out = []
    for c in a.changes:
        if c.verdict in (HELPS, UNMEASURED):
            continue
        out.append(f"#{c.id} {c.description[:60]}: {c.verdict} ({_pm(c.gain, c.ci)}); "
                   + ("consider dropping it before merging" if c.gain is not None
                      and c.ci is not None and c.gain - c.ci <= 0 else
                      "keep it together with the changes it works with"))
    if a.additive is False:
        out.append("the kept changes interact (their leave-one-out gains do not add up): "
                   "merge them as one chain, not one by one")
    return out


def _from_evidence(report: Report) -> list[str]:
    h = report.headline
    out = []
    weak = [k for k in report.kept if not k.supported]
    if weak:
        ids = ", ".join(f"#{k.id}" for k in weak[:4])
        out.append(f"confirm the keeps on weak evidence ({ids}): re-run them with more seeds "
                   "before relying on them")
    if h.improvement is not None and h.improvement_ci is not None and h.kept and \
            h.improvement - h.improvement_ci <= 0:
        out.append("the night's gain is within the noise: more runs per change (max_runs) or a "
                   "longer budget")
    return out


def _from_digest(ins: Insights) -> list[str]:
    out = []
    if ins.near_misses:
        shown = ", ".join(n.split(":")[0] for n in ins.near_misses[:4])
        out.append(f"re-test or combine the near-misses ({shown}: discarded within the noise "
                   "of the incumbent runs they were compared with)")
    found = []
    for k in ins.knobs:
        for e in k.effects:
            err = e.stderr or 0.0
            if e.mean_gain > 0 and e.mean_gain > err and e.kept < e.runs:
                measured = e.runs - e.stopped  # a stopped change has no gain
                found.append(f"{k.name} {e.direction} ({e.mean_gain:+.3g} over {measured} run"
                             f"{'s' if measured > 1 else ''})")
    if found:
        out.append("push further where the effect was positive: "
                   + ", ".join(found[:MAX_DIRECTIONS]))
    if ins.plateau.startswith("plateau"):
        out.append(f"the search ended on a plateau (over {PLATEAU_AFTER} runs without a keep): "
                   "another area, bigger steps, or a language-model proposer")
    return out


def _from_crashes(report: Report) -> list[str]:
    ran, crashed = report.night.tried, report.night.crashed
    if not ran or not report.crashes or crashed / ran < 0.25:
        return []
    top = report.crashes[0]
    return [f"{crashed} of {ran} changes tried crashed or timed out (most: {top.cause}, "
            f"{top.count}×): fix that before the next night"]


def _pm(value: float | None, ci: float | None) -> str:
    if value is None:
        return "not measured"
    return f"{value:+.6f}" + (f" ± {ci:.3g}" if ci is not None else "")  # as every screen


# --- beyond the night: the confirmation and the holdout ---------------------------------------
def scale_steps(sweep: str, kept: int, budget_s: float, c: Confirmation | None,
                h: Holdout | None) -> tuple[list[str], list[str]]:
    """What to try next from the confirmation and the holdout: (pressing, later)."""
    first, later = [], []
    if c is not None and c.verdict in (SHRINKS, FLIPS):
        first.append(f"the gain {c.verdict} at `{c.at}` ({c.reason}): check it at the "
                     "setting you will train at before merging")
    elif c is None and kept:
        later.append(f"check that the gain holds at a longer budget: `overnight confirm "
                     f"--sweep {sweep} --at budget={budget_s * 10:g}` (2 × 3 runs)")
    rows = {r.label: r for r in (h.rows if h is not None else ())}
    a, b = rows.get("baseline"), rows.get("best")
    if a and b and None not in (a.validation, b.validation, a.holdout, b.holdout):
        assert a.validation is not None and b.validation is not None
        assert a.holdout is not None and b.holdout is not None
        val, hold = b.validation - a.validation, b.holdout - a.holdout
        if val and (hold == 0 or (hold > 0) != (val > 0)):
            first.append(f"the holdout does not share the validation gain ({val:+.6f} vs "
                         f"{hold:+.6f}): the night fitted its validation slice")
    return first, later


def holdout_of(sweep: Sweep, baseline_commit: str | None, runs: Sequence[Run]) -> Holdout | None:
    """Validation vs holdout for the baseline and the best (None: the target names no
    holdout_metric). Sealed, with no numbers, while the sweep has not finished."""
    key = sweep.config.holdout_metric
    if not key:
        return None
    if not sweep.status.is_finished():
        return Holdout(sweep.metric, key, (), sealed=True)
    rows = []
    for label, commit in (("baseline", baseline_commit), ("best", sweep.best_commit)):
        if not commit:
            continue
        good = [r for r in runs if r.commit == commit and r.status is RunStatus.OK]
        val = [r.metric for r in good if r.metric is not None]
        hold = [r.holdout for r in good if r.holdout is not None]
        rows.append(HoldoutRow(label, commit[:7], _mean(val), len(val), _mean(hold), len(hold)))
    return Holdout(sweep.metric, key, tuple(rows))


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
