"""The morning report of a sweep, read from the store: its records, its LLM spend and, when
`overnight finalize --ablate` measured it, the attribution of its gain to each kept change;
when `overnight confirm` re-ran it at a larger setting, whether the gain holds; after the
night, validation vs the sealed holdout metric.

For `overnight report`, the dashboard's report page, MCP's `get_report` and the notifications'
headline alike. Store port only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from agent.analysis.ablation import (
    BASELINE,
    BEST,
    DEFAULT_SEEDS,
    MINUS,
    Attribution,
    KeptChange,
    VariantKey,
    ablated_sweep,
    attribute,
    variant_keys,
)
from agent.analysis.evidence import sweep_evidence
from agent.analysis.morning import (
    MAX_STEPS,
    Headline,
    Report,
    build_report,
    holdout_of,
    scale_steps,
)
from agent.analysis.morning import headline_of as headline
from agent.core.domain import (
    Experiment,
    ExperimentStatus,
    Run,
    RunStatus,
    Sweep,
    SweepStatus,
    utcnow,
)
from agent.core.ports import Store
from agent.ops.confirm import confirmation_of

S = ExperimentStatus


def report_of(store: Store, name: str, now: datetime | None = None) -> Report:
    """The report of sweep `name` (NotFoundError if there is none)."""
    sweep = store.get_sweep(name)
    exps = store.list_experiments(sweep.id)
    runs = store.list_runs(sweep_id=sweep.id)
    ablation = latest_ablation(store, sweep)
    attribution = attribution_of(store, sweep, exps, runs, ablation) if ablation else None
    report = build_report(sweep, exps, runs, store.llm_usage(sweep.id), now or utcnow(),
                          attribution, DEFAULT_SEEDS)
    h = report.headline
    base = next((e.commit for e in exps if e.is_baseline and e.status is S.KEPT and e.commit),
                None)
    confirmation = confirmation_of(store, sweep, (h.improvement, h.improvement_ci, h.baseline))
    holdout = holdout_of(sweep, base, runs)
    first, later = scale_steps(sweep.name, len(report.kept), sweep.budget_s, confirmation,
                               holdout)
    steps = [*first, *report.next_steps, *later][:MAX_STEPS]
    return replace(report, confirmation=confirmation, holdout=holdout, next_steps=steps)


def headline_of(store: Store, name: str) -> Headline:
    """The report's headline alone (what a notification carries): the evidence, no digest."""
    sweep = store.get_sweep(name)
    exps = store.list_experiments(sweep.id)
    runs = store.run_metrics(sweep.id)
    return headline(sweep, sweep_evidence(sweep, exps, runs), runs, exps)


def ablations_of(store: Store, sweep: Sweep) -> list[Sweep]:
    """The ablation sweeps of `sweep`, oldest first."""
    return [s for s in store.list_sweeps() if ablated_sweep(s.proposer) == sweep.name]


def latest_ablation(store: Store, sweep: Sweep) -> Sweep | None:
    """The newest finished ablation of `sweep` (a running one is not reported yet)."""
    done = [s for s in ablations_of(store, sweep) if s.status is SweepStatus.DONE]
    return done[-1] if done else None


def attribution_of(store: Store, sweep: Sweep, exps: Sequence[Experiment],
                   runs: Sequence[Run], ablation: Sweep) -> Attribution:
    """The attribution an ablation sweep measured, against the night's gains of `sweep`."""
    variants, notes, chain, samples = _variants(store, ablation)
    by_id = {e.id: e for e in exps}
    kept = [night_gain(by_id[i], runs, sweep) for i in chain if i in by_id]
    sigma = sweep_evidence(sweep, list(exps), list(runs)).sigma
    return attribute(ablation.name, sweep.direction, kept, variants, sigma,
                     ablation.config.baseline_runs, notes, samples)


def _variants(store: Store, ablation: Sweep) -> tuple[
        dict[VariantKey, list[float]], dict[int, str], list[int], list[list[float]]]:
    """Each variant's good metrics, why a variant has none (by left-out id), the chain, and
    the good metrics of each experiment once (an experiment can be two variants)."""
    metrics: dict[int, list[float]] = {}
    for r in store.list_runs(sweep_id=ablation.id):
        if r.status is RunStatus.OK and r.metric is not None:
            metrics.setdefault(r.experiment_id, []).append(r.metric)
    variants: dict[VariantKey, list[float]] = {}
    notes: dict[int, str] = {}
    chain: list[int] = []
    for e in store.list_experiments(ablation.id):
        info = e.meta.get("ablation")
        if isinstance(info, dict) and info.get("chain"):
            chain = [int(i) for i in info["chain"]]
        for key in [(BEST, None)] if e.is_baseline else variant_keys(e.meta):
            values = metrics.get(e.id, [])
            variants.setdefault(key, []).extend(values)
            if not values and key[0] == MINUS and key[1] is not None and e.status.is_finished():
                notes[key[1]] = f"{e.status.value}: {(e.reason or '').splitlines()[0][:160]}" \
                    if e.reason else e.status.value
    for key in [(BEST, None), (BASELINE, None)]:
        variants.setdefault(key, [])
    return variants, notes, chain, list(metrics.values())


def night_gain(e: Experiment, runs: Sequence[Run], sweep: Sweep) -> KeptChange:
    """A kept change's gain when it was kept, as its record says (over the incumbent runs it
    was compared with), and the runs on each side."""
    record = e.record
    if record is None:
        return KeptChange(e.id, e.description, None, 1, 1)
    gain = record.gain(sweep.direction.value == "minimize")
    compared = record.incumbent.n if record.incumbent is not None else 0
    return KeptChange(e.id, e.description, gain, max(record.n, 1), max(compared, 1))
