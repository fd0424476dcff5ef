"""Result tables: autoresearch's results.tsv and compact rows for terminals and agents. Pure."""

from __future__ import annotations

from typing import Any

from agent.analysis.evidence import ExperimentEvidence, SweepEvidence
from agent.analysis.projection import memory_gb
from agent.core.domain import Experiment, ExperimentStatus, Sweep, stopped_at, stopped_text

TSV_HEADER = ("commit", "val_bpb", "memory_gb", "status", "description")
_TSV_STATUS = {
    ExperimentStatus.KEPT: "keep",
    ExperimentStatus.DISCARDED: "discard",
    ExperimentStatus.CRASHED: "crash",
    ExperimentStatus.TIMEOUT: "crash",
}


def results_tsv(
    sweep: Sweep, experiments: list[Experiment], evidence: SweepEvidence | None = None
) -> str:
    """autoresearch's results.tsv: only runs (kept, discarded, crashed); crash metric 0.000000.

    The second column is named after the sweep's metric (val_bpb for the gpt target); the
    metric is the experiment's value as the keep rule decided it. A change the early stop
    ended is `stopped`, its metric empty (it was never measured; the mean of its earlier runs
    when it had some) and its description says where it was stopped; a discard with no value
    (not judged: the machine moved under it) has its metric empty too. With `evidence`
    (`--format tsv-full`), four more columns: n, sd, p_better and the runs' metrics
    (comma-separated).
    """
    header = list(TSV_HEADER)
    header[1] = sweep.metric
    if evidence is not None:
        header += ["n", "sd", "p_better", "runs"]
    lines = ["\t".join(header)]
    for exp in experiments:
        status = _TSV_STATUS.get(exp.status)
        if status is None:
            continue
        metric = exp.metric if status != "crash" and exp.metric is not None else 0.0
        desc = " ".join(exp.description.split()).replace("\t", " ")
        value = "" if exp.metric is None and status != "crash" else f"{metric:.6f}"
        stop = stopped_at(exp.meta)
        if stop is not None:  # not a crash: never measured, so no value (not 0.000000)
            status, value = "stopped", "" if exp.metric is None else value
            desc += f" [{stopped_text(stop)}]"
        cells = [(exp.commit or "")[:7], value, f"{memory_gb(exp):.1f}", status, desc]
        if evidence is not None:
            cells += _full_cells(evidence.experiments.get(exp.id))
        lines.append("\t".join(cells))
    return "\n".join(lines) + "\n"


def _full_cells(ev: ExperimentEvidence | None) -> list[str]:
    if ev is None:
        return ["0", "", "", ""]
    return [
        str(ev.n),
        "" if ev.sd is None else f"{ev.sd:.6f}",
        "" if ev.p_better is None else f"{ev.p_better:.3f}",
        ",".join(f"{v:.6f}" for v in ev.runs),
    ]


def evidence_row(ev: ExperimentEvidence | None) -> dict[str, Any]:
    """n (the keep rule's), mean of its OK runs, sd, 95 % CI half-width, P(better), the OK
    runs, the incumbent runs each ran beside, why a run was suspect, and a kept commit's
    re-runs as the incumbent with its value now, JSON-ready."""
    if ev is None:
        return {"n": 0, "mean": None, "sd": None, "ci95": None, "p_better": None, "runs": [],
                "pairs": [], "suspect": [], "reruns": 0, "commit_mean": None, "commit_n": 0}
    return {
        "n": ev.n,
        "mean": ev.mean,
        "sd": ev.sd,
        "ci95": ev.ci,
        "p_better": ev.p_better,
        "runs": list(ev.runs),
        "pairs": [{"run": c, "incumbent_run": b} for c, b in ev.pairs],
        "suspect": [{"run": r, "why": why} for r, why in ev.suspect],
        "reruns": ev.reruns,  # the commit's runs as the incumbent, and the mean of all its runs
        "commit_mean": ev.commit_mean,  # its value now (the keep rule's record of it)
        "commit_n": ev.commit_n,
    }


def sweep_evidence_row(ev: SweepEvidence) -> dict[str, Any]:
    return {
        "sigma": ev.sigma,
        "sigma_df": ev.df,
        "detectable_effect": ev.detectable,
        "improvement": ev.improvement,
        "improvement_ci95": ev.improvement_ci,
        "kept": ev.kept,
        "kept_supported": ev.supported,
        "statement": ev.statement(),
    }


def evidence_header(ev: SweepEvidence, metric: str) -> str:
    """σ̂, the smallest detectable effect and the improvement ± CI, in one line."""
    df = f"{ev.df} df" if ev.df else "known"
    parts = [f"σ̂ {ev.sigma:.3g} ({df})" if ev.sigma is not None else "σ̂ not measured"]
    if ev.detectable is not None:
        parts.append(f"smallest detectable effect {ev.detectable:.3g}")
    if ev.improvement is not None and ev.kept:
        ci = f" ± {ev.improvement_ci:.3g}" if ev.improvement_ci is not None else ""
        parts.append(f"improvement {ev.improvement:+.4g}{ci} {metric}")
    return "; ".join(parts)


def shown_status(exp: Experiment) -> str:
    """The status a person reads: `stopped` for a change the early stop ended (recorded as
    discarded), with the crash kind of a crash."""
    if stopped_at(exp.meta) is not None:
        return "stopped"
    return exp.status.value + (f" ({exp.crash_kind.value})" if exp.crash_kind else "")


def fmt_metric(value: float | None) -> str:
    return "-" if value is None else f"{value:.6f}"


def fmt_delta(value: float | None) -> str:
    return "" if value is None else f"{value:+.6f}"


def improvement(sweep: Sweep) -> float | None:
    """Relative improvement of best over baseline, signed so that better is positive."""
    base, best = sweep.baseline_metric, sweep.best_metric
    if base is None or best is None or base == 0:
        return None
    rel = (base - best) / abs(base)
    return rel if sweep.direction.value == "minimize" else -rel
