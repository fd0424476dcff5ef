"""Result tables: autoresearch's results.tsv and compact rows for terminals and agents. Pure."""

from __future__ import annotations

import math
from typing import Any

from agent.domain import Experiment, ExperimentStatus, Sweep

TSV_HEADER = ("commit", "val_bpb", "memory_gb", "status", "description")
_TSV_STATUS = {
    ExperimentStatus.KEPT: "keep",
    ExperimentStatus.DISCARDED: "discard",
    ExperimentStatus.CRASHED: "crash",
    ExperimentStatus.TIMEOUT: "crash",
}


def memory_gb(exp: Experiment) -> float:
    mb = exp.summary.get("peak_memory_mb", exp.summary.get("peak_vram_mb"))
    if not isinstance(mb, int | float) or not math.isfinite(mb):
        return 0.0
    return round(mb / 1024, 1)


def results_tsv(sweep: Sweep, experiments: list[Experiment]) -> str:
    """autoresearch's results.tsv: only runs (kept, discarded, crashed); crash metric 0.000000.

    The second column is named after the sweep's metric (val_bpb for the gpt target).
    """
    header = list(TSV_HEADER)
    header[1] = sweep.metric
    lines = ["\t".join(header)]
    for exp in experiments:
        status = _TSV_STATUS.get(exp.status)
        if status is None:
            continue
        metric = exp.metric if status != "crash" and exp.metric is not None else 0.0
        desc = " ".join(exp.description.split()).replace("\t", " ")
        lines.append(
            "\t".join(
                [(exp.commit or "")[:7], f"{metric:.6f}", f"{memory_gb(exp):.1f}", status, desc]
            )
        )
    return "\n".join(lines) + "\n"


def experiment_row(exp: Experiment) -> dict[str, Any]:
    """A compact, JSON-ready row (used by `results --format json` and agent tools)."""
    return {
        "id": exp.id,
        "status": exp.status.value,
        "crash_kind": exp.crash_kind.value if exp.crash_kind else None,
        "metric": exp.metric,
        "delta": exp.delta,
        "commit": (exp.commit or "")[:7] or None,
        "memory_gb": memory_gb(exp),
        "training_seconds": exp.summary.get("training_seconds"),
        "description": exp.description,
        "parent_id": exp.parent_id,
        "reason": exp.reason,
    }


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
