"""Result tables: autoresearch's results.tsv and compact rows for terminals and agents. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent.analysis.evidence import ExperimentEvidence, SweepEvidence
from agent.analysis.projection import memory_gb
from agent.analysis.secondary import by_experiment
from agent.core.config import Direction
from agent.core.domain import Experiment, ExperimentStatus, Run, Sweep, stopped_at
from agent.core.record import Ending
from agent.rules.wording import comparison, metric_text

TSV_HEADER = ("commit", "val_bpb", "memory_gb", "status", "description")
_TSV_STATUS = {
    ExperimentStatus.KEPT: "keep",
    ExperimentStatus.DISCARDED: "discard",
    ExperimentStatus.CRASHED: "crash",
    ExperimentStatus.TIMEOUT: "crash",
}


def results_tsv(
    sweep: Sweep, experiments: list[Experiment], evidence: SweepEvidence | None = None,
    runs: Sequence[Run] | None = None,
) -> str:
    """autoresearch's results.tsv: only runs (kept, discarded, crashed); crash metric 0.000000.

    The second column is named after the sweep's metric (val_bpb for the gpt target); the
    metric is the experiment's value: the mean of the runs its record names (measured). A
    change the early stop ended is `stopped`, its metric empty (it was never measured; the mean
    of its earlier runs when it had some) and its description says where it was stopped; a
    discard with no run in its value (not judged: the machine moved under it) has its metric
    empty too; a kept commit measured again since says its value now in its description. With
    `evidence` (`--format tsv-full`), six more columns: n, sd, p_better, the runs' metrics
    (comma-separated), and the inferred difference from the incumbent runs it was compared
    with and its standard error; with the sweep's `runs` too, two more per `[target] secondary`
    key: its mean over the runs the value rests on (four significant digits, empty when none
    reported it) and how many of them did (`<key>_n`).
    """
    header = list(TSV_HEADER)
    header[1] = sweep.metric
    if evidence is not None:
        header += ["n", "sd", "p_better", "runs", "difference", "se"]
    keys = sweep.config.secondary if evidence is not None and runs is not None else ()
    secondary = by_experiment(experiments, runs or (), keys)
    header += [col for key in keys for col in (key, f"{key}_n")]
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
            desc += f" [{stop.text()}]"
        one = evidence.experiments.get(exp.id) if evidence is not None else None
        now = one.remeasured_text(exp.metric, "measured" if exp.is_baseline else "kept") \
            if one is not None else ""
        desc += f" [{now}]" if now else ""
        cells = [(exp.commit or "")[:7], value, f"{memory_gb(exp):.1f}", status, desc]
        if evidence is not None:
            cells += _full_cells(one, exp)
        for m in secondary.get(exp.id, ()):
            cells += ["" if m.mean is None else m.text, str(m.n)]
        lines.append("\t".join(cells))
    return "\n".join(lines) + "\n"


def _full_cells(ev: ExperimentEvidence | None, exp: Experiment) -> list[str]:
    record = exp.record
    difference = "" if record is None else fmt_delta(record.difference)
    se = "" if record is None or record.se is None else f"{record.se:.6f}"
    if ev is None:
        return ["0", "", "", "", difference, se]
    return [
        str(ev.n),
        "" if ev.sd is None else f"{ev.sd:.6f}",
        "" if ev.p_better is None else f"{ev.p_better:.2f}",
        ",".join(f"{v:.6f}" for v in ev.runs),
        difference,
        se,
    ]


def evidence_row(ev: ExperimentEvidence | None) -> dict[str, Any]:
    """n and the mean of the runs its value rests on (its record: measured), their sd, the 95 %
    CI half-width on σ̂ at its decision and P(better) (inferred), those runs' values, the
    incumbent runs each ran beside, the runs set aside (why), and a kept commit's re-runs as the
    incumbent with its value now, JSON-ready."""
    if ev is None:
        return {"n": 0, "mean": None, "sd": None, "ci95": None, "p_better": None, "runs": [],
                "pairs": [], "set_aside": [], "reruns": 0, "commit_mean": None,
                "commit_n": 0}
    return {
        "n": ev.n,
        "mean": ev.mean,
        "sd": ev.sd,
        "ci95": ev.ci,
        "p_better": ev.p_better,
        "runs": list(ev.runs),
        "pairs": [{"run": c, "incumbent_run": b} for c, b in ev.pairs],
        "set_aside": [{"run": r, "why": why} for r, why in ev.set_aside],
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
    """σ̂ now, the smallest detectable effect and the improvement ± CI, in one line."""
    df = f"{ev.df} df" if ev.df else "known"
    parts = [f"σ̂ now {ev.sigma:.3g} {metric} ({df}; the run-to-run noise, pooled over the "
             "night)" if ev.sigma is not None else "σ̂ not measured"]
    if ev.detectable is not None:
        parts.append(f"smallest detectable effect {ev.detectable:.3g} {metric}")
    if ev.improvement is not None and ev.kept:
        ci = f" (95 % interval ± {ev.improvement_ci:.3g})" if ev.improvement_ci is not None \
            else ""
        parts.append(f"improvement baseline → best {fmt_delta(ev.improvement)} {metric}{ci}")
    return "; ".join(parts)


def shown_status(exp: Experiment) -> str:
    """The status a person reads: `stopped` for a change the early stop ended (recorded as
    discarded), `not started` for one the executor could not start (recorded as cancelled),
    with the crash kind of a crash."""
    if stopped_at(exp.meta) is not None:
        return "stopped"
    record = exp.record
    if record is not None and record.ending is Ending.NOT_STARTED:
        return Ending.NOT_STARTED.value
    return exp.status.value + (f" ({exp.crash_kind.value})" if exp.crash_kind else "")


def fmt_metric(value: float | None) -> str:
    return "-" if value is None else metric_text(value)


def fmt_delta(value: float | None) -> str:
    """Signed to six decimals; a difference that rounds to zero reads 0.000000, not -0.000000."""
    if value is None:
        return ""
    return f"{value:+.6f}" if round(value, 6) != 0 else "0.000000"


def difference_cell(exp: Experiment) -> str:
    """Inferred: its difference from the incumbent runs it was compared with, signed as the
    metric, ± its standard error ("-0.175947 ± 0.302"); "" when it was not compared."""
    record = exp.record
    if record is None or record.difference is None:
        return ""
    return fmt_delta(record.difference) + (f" ± {record.se:.3g}" if record.se is not None else "")


def runs_cell(exp: Experiment, ev: ExperimentEvidence | None) -> str:
    """The runs its value rests on, then those set aside (another machine speed, in no value)
    and, for a kept commit, its runs since as the incumbent: "3 +2 set aside +4 re-runs"."""
    if ev is None:
        return ""
    parts = [str(ev.n)] if ev.n or exp.status.is_finished() else []
    if ev.set_aside:
        parts.append(f"+{len(ev.set_aside)} set aside")
    if ev.reruns:
        parts.append(f"+{ev.reruns} re-run{'s' if ev.reruns != 1 else ''}" + (
            f" ({ev.reruns_set_aside} set aside)" if ev.reruns_set_aside else ""))
    return " ".join(parts)


def comparison_line(exp: Experiment, direction: Direction, by_speed: bool = True) -> str:
    """What its runs measured and how it compared, each number's reference named (agent.rules.
    wording): "3.3755 on 1 run: better than the incumbent's run beside it (3.5515) by 0.176 ±
    0.302"; a baseline "mean 3.58402 of 3 runs"; "" when its record has no runs."""
    record = exp.record
    if record is None:
        return "" if exp.metric is None else fmt_metric(exp.metric)
    if not record.change.n:
        return ""
    return comparison(record.change, record.incumbent, record.difference, record.se, direction,
                      record.beside, len(record.conditions), by_speed)


def improvement(sweep: Sweep) -> float | None:
    """Relative improvement of best over baseline, signed so that better is positive."""
    base, best = sweep.baseline_metric, sweep.best_metric
    if base is None or best is None or base == 0:
        return None
    rel = (base - best) / abs(base)
    return (rel if sweep.direction.value == "minimize" else -rel) + 0.0  # never -0.0
