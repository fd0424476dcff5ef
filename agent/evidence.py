"""The evidence behind a sweep's results: each experiment's mean ± 95 % CI, n and P(better), the
sweep's σ̂, the smallest effect it can detect, the improvement ± CI and an honest statement.

Pure: stdlib, the domain, config and noise only. Computed from the run records, so it moves
as the incumbent is re-measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from agent.domain import Direction, Experiment, ExperimentStatus, Run, RunRole, RunStatus, Sweep
from agent.noise import ci95, mean, p_better, pooled_sigma, sample_sd, z_score

SUPPORTED_P = 0.96  # P(better) of a keep at z = 1.75, the default keep threshold


@dataclass(frozen=True)
class ExperimentEvidence:
    n: int
    mean: float | None
    sd: float | None
    ci: float | None  # half-width of the 95 % interval of the mean (with σ̂)
    p_better: float | None  # vs the runs of the commit it was built on
    runs: tuple[float, ...]


@dataclass(frozen=True)
class SweepEvidence:
    sigma: float | None  # pooled within-commit standard deviation of the sweep's runs
    df: int
    detectable: float | None  # the true gain kept half the time after two runs
    improvement: float | None  # baseline mean − best mean, better = positive
    improvement_ci: float | None
    kept: int  # kept changes (baseline excluded)
    supported: int  # of those, kept with P(better) ≥ SUPPORTED_P
    experiments: Mapping[int, ExperimentEvidence] = field(default_factory=dict)

    def statement(self) -> str:
        """One honest line for the morning: how many keeps the noise supports."""
        sigma = f"σ̂ = {self.sigma:.3g}" if self.sigma is not None else "σ̂ not measured"
        if self.supported:
            weak = self.kept - self.supported
            more = f"; {weak} more kept on weaker evidence" if weak else ""
            plural = "s" if self.supported > 1 else ""
            return (
                f"{self.supported} change{plural} kept with P ≥ {SUPPORTED_P:.2f} ({sigma}){more}"
            )
        if self.kept:
            return f"{self.kept} change(s) kept, none with P ≥ {SUPPORTED_P:.2f} ({sigma})"
        return f"nothing beat the noise ({sigma})"


def _good(runs: list[Run]) -> list[Run]:
    return [r for r in runs if r.status is RunStatus.OK and r.metric is not None]


def sweep_evidence(sweep: Sweep, experiments: list[Experiment], runs: list[Run]) -> SweepEvidence:
    """The evidence of a whole sweep from its experiments and run records."""
    good = _good(runs)
    by_commit: dict[str, list[float]] = {}
    for r in good:
        by_commit.setdefault(r.commit, []).append(r.metric)  # type: ignore[arg-type]
    by_exp: dict[int, list[float]] = {}
    for r in good:
        if r.role is not RunRole.INCUMBENT:
            by_exp.setdefault(r.experiment_id, []).append(r.metric)  # type: ignore[arg-type]
    sigma, df = pooled_sigma(list(by_commit.values()))
    config = sweep.config
    if config.noise_sigma is not None:
        sigma = config.noise_sigma
    sign = 1.0 if sweep.direction is Direction.MINIMIZE else -1.0
    per = PerExperiment({
        e.id: (by_exp.get(e.id, []),
               by_commit.get(e.base_commit or "", []) if not e.is_baseline else [])
        for e in experiments}, sigma, sign)
    baseline = next((e for e in experiments if e.is_baseline), None)
    base_runs = by_commit.get(baseline.commit or "", []) if baseline else []
    best_runs = by_commit.get(sweep.best_commit or "", [])
    improvement = ci = detectable = None
    if base_runs and best_runs:
        improvement = sign * (mean(base_runs) - mean(best_runs))  # type: ignore[operator]
        if sigma is not None:
            ci = (
                0.0
                if baseline and baseline.commit == sweep.best_commit
                else (1.96 * sigma * math.sqrt(1 / len(base_runs) + 1 / len(best_runs)))
            )
    if sigma is not None and best_runs:
        detectable = config.keep_z * sigma * math.sqrt(0.5 + 1 / len(best_runs)) + sweep.min_delta
    kept = [e for e in experiments if e.status is ExperimentStatus.KEPT and not e.is_baseline]
    supported = sum(
        1 for e in kept if (per[e.id].p_better or 0.0) >= SUPPORTED_P and per[e.id].n >= 2
    )
    return SweepEvidence(sigma, df, detectable, improvement, ci, len(kept), supported, per)


class PerExperiment(Mapping[int, ExperimentEvidence]):
    """Each experiment's evidence by id, worked out the first time it is asked for: a page
    shows a few dozen of a sweep's thousands (a dict's equality and iteration otherwise)."""

    def __init__(self, inputs: dict[int, tuple[list[float], list[float]]], sigma: float | None,
                 sign: float) -> None:
        self._inputs, self._sigma, self._sign = inputs, sigma, sign
        self._done: dict[int, ExperimentEvidence] = {}

    def __getitem__(self, key: int) -> ExperimentEvidence:
        hit = self._done.get(key)
        if hit is None:
            values, base = self._inputs[key]
            hit = self._done[key] = _one(values, base, self._sigma, self._sign)
        return hit

    def __iter__(self) -> Iterator[int]:
        return iter(self._inputs)

    def __len__(self) -> int:
        return len(self._inputs)


def _one(
    values: list[float], base: list[float], sigma: float | None, sign: float
) -> ExperimentEvidence:
    m = mean(values)
    p = None
    if m is not None and base and sigma is not None:
        gain = sign * (mean(base) - m)  # type: ignore[operator]
        p = p_better(z_score(gain, sigma, len(values), len(base)))
    return ExperimentEvidence(
        len(values), m, sample_sd(values), ci95(values, sigma), p, tuple(values)
    )
