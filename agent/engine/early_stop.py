"""Early stop of a clearly losing run while it trains: its loss curve by fraction of the budget
against the incumbent's runs' curves, judged by agent.rules.prune at the policy's checks.

Used by agent.engine.attempt. Not retention (db/pruning.py, `pruned_at`: old logs removed);
this stops a live run. Guaranteed: only a change's own runs (screen, confirm) of a target with
`prune = "auto"` are judged, never the baseline's, the incumbent's or an evaluation re-run; the
incumbent's curves are read once, before the run starts, so the line callback never waits on
the store; the spread also pools the curves of every earlier incumbent of the sweep (each
kept commit before the current one: `earlier_curves`), as the keep rule's σ̂ pools the night,
so a new incumbent with its 2 runs judges its first challengers; the bar is the futility
boundary's (agent.rules.decide.stop_level: β = 1 % over a change's checks); a stop sets the
run's own stop event (the runner then ends its process tree) and leaves the experiment's stop
event alone (a stop asked by a person stays a cancel).
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agent.core.domain import (
    CurvePoints,
    Experiment,
    ExperimentStatus,
    Run,
    RunRole,
    RunSpec,
    RunStatus,
    Sweep,
)
from agent.core.ports import Store
from agent.rules.categories import category_of
from agent.rules.placement import agrees
from agent.rules.prune import GRID, Curve, PruneCall, PrunePolicy, check, next_check
from runner.summary import ProgressPoint

logger = logging.getLogger(__name__)
# a run's recorded curve: the mean point of each 1/200 of the budget, the check's matched points
CURVE_BINS = GRID
CHALLENGER_ROLES = (RunRole.SCREEN, RunRole.CONFIRM)
# The incumbent's runs a challenger is judged against: those at its most common speed (a suspect
# run measured a slower or faster machine; its curve would move the reference and the speed).
REFERENCE_STATUSES = (RunStatus.OK,)


class RunStop(threading.Event):
    """A run's own stop, also set while the experiment's is: the runner polls `is_set`."""

    def __init__(self, experiment_stop: threading.Event) -> None:
        super().__init__()
        self.experiment_stop = experiment_stop

    def is_set(self) -> bool:
        return super().is_set() or self.experiment_stop.is_set()


class RunCurve:
    """A run's loss by fraction of the budget, as the mean (fraction, loss, step) of each of
    CURVE_BINS equal bins (points past the budget go to the last): bounded, whatever the
    number of progress lines."""

    def __init__(self, bins: int = CURVE_BINS) -> None:
        self.bins = bins
        self.sums: dict[int, list[float]] = {}  # bin -> [n, Σ fraction, Σ loss, Σ step]

    def add(self, fraction: float, loss: float, step: float) -> None:
        if not (math.isfinite(fraction) and math.isfinite(loss)) or fraction < 0:
            return
        b = min(int(fraction * self.bins), self.bins - 1)
        acc = self.sums.setdefault(b, [0.0, 0.0, 0.0, 0.0])
        for i, v in enumerate((1.0, fraction, loss, step)):
            acc[i] += v

    def points(self) -> CurvePoints:
        return tuple((acc[1] / acc[0], acc[2] / acc[0], acc[3] / acc[0])
                     for _, acc in sorted(self.sums.items()))

    @property
    def last_fraction(self) -> float:
        return max((acc[1] / acc[0] for acc in self.sums.values()), default=0.0)


def loss_pairs(points: CurvePoints) -> list[tuple[float, float]]:
    """The rule's curve: (fraction, loss) of each recorded point."""
    return [(f, loss) for f, loss, _ in points]


def on_steps(points: CurvePoints, per_budget: float | None) -> list[tuple[float, float]]:
    """The rule's curve with its points placed by step, not time: (step / `per_budget`, loss),
    where `per_budget` is the judged run's steps over its whole budget at its pace so far. Every
    curve is then read at the run's own steps (agent.rules.prune.matched), so a machine that
    ran one run slower moves no loss; on a budget of steps it is the fraction itself. None:
    by fraction (loss_pairs)."""
    if not per_budget:
        return loss_pairs(points)
    return [(step / per_budget, loss) for _, loss, step in points]


def steps_per_budget(fraction: float, step: float) -> float | None:
    """A run's steps over its whole budget at its pace so far (None before it has any)."""
    return step / fraction if fraction > 0 and step > 0 else None


def placer(fraction: float, step: float | None) -> Callable[[CurvePoints], Curve]:
    """How a check at `fraction` places every curve (the judged run's, its references'): by
    the judged run's own steps, it having reached `step` there (on_steps; by fraction when
    None). The engine's checks and the dashboard's band both read curves through this."""
    per = steps_per_budget(fraction, step) if step is not None else None
    return lambda points: on_steps(points, per)


def step_at(points: CurvePoints, fraction: float) -> float | None:
    """The step a curve had reached at `fraction` (linear between its points; None before its
    first point or past its last)."""
    before = [p for p in points if p[0] <= fraction]
    after = [p for p in points if p[0] >= fraction]
    if not before or not after:
        return None
    (f0, _, s0), (f1, _, s1) = before[-1], after[0]
    return s0 if f1 == f0 else s0 + (s1 - s0) * (fraction - f0) / (f1 - f0)


@dataclass(frozen=True)
class Reference:
    """What a challenger run is judged against, read before it starts."""

    curves: tuple[CurvePoints, ...]  # the incumbent's runs', same seed first
    category: str | None
    budget_s: float
    level: float  # the futility boundary's bar for "behind" (agent.rules.decide.stop_level)
    tolerance: float  # the keep rule's speed tolerance: a run outside it is not judged
    policy: PrunePolicy = field(default_factory=PrunePolicy)
    # the earlier incumbents' curves, one group per commit, newest first (the spread pools them)
    earlier: tuple[tuple[CurvePoints, ...], ...] = ()


def may_stop_early(sweep: Sweep, exp: Experiment, spec: RunSpec,
                   incumbent_commit: str | None) -> bool:
    """Whether this run may be stopped early: a change's own run (not the commit it was built
    on), on a target that asks."""
    return (sweep.config.prune == "auto" and not exp.is_baseline
            and spec.experiment_id == exp.id and spec.role in CHALLENGER_ROLES
            and incumbent_commit is not None and spec.commit != incumbent_commit)


def build_reference(exp: Experiment, runs: Sequence[Run], seed: int,
                    incumbent_commit: str | None, budget_s: float, level: float,
                    tolerance: float, *, policy: PrunePolicy | None = None,
                    earlier: Sequence[Sequence[CurvePoints]] = ()) -> Reference:
    """The incumbent's completed runs' curves (same seed first), the change's category, and
    the earlier incumbents' curves (`earlier_curves`) for the spread."""
    incumbent_runs = [r for r in runs if r.commit == incumbent_commit
                      and r.status in REFERENCE_STATUSES and r.curve]
    incumbent_runs.sort(key=lambda r: (r.seed != seed, r.id))
    return Reference(tuple(r.curve for r in incumbent_runs if r.curve), category_of(exp).value,
                     budget_s, level, tolerance, policy=policy or PrunePolicy(),
                     earlier=tuple(tuple(g) for g in earlier if g))


def earlier_curves(store: Store, sweep_id: int,
                   incumbent_commit: str | None) -> list[tuple[CurvePoints, ...]]:
    """The completed runs' curves of the sweep's kept commits other than the incumbent's, one
    group per commit, newest first (each read from the experiment that kept it: the keeps'
    runs, not the sweep's)."""
    kept = store.list_experiments(sweep_id=sweep_id, statuses=[ExperimentStatus.KEPT],
                                  newest_first=True)
    groups: list[tuple[CurvePoints, ...]] = []
    seen = {incumbent_commit}
    for e in kept:
        if e.commit is None or e.commit in seen:
            continue
        seen.add(e.commit)
        curves = tuple(r.curve for r in store.list_runs(experiment_id=e.id)
                       if r.commit == e.commit and r.status in REFERENCE_STATUSES and r.curve)
        if curves:
            groups.append(curves)
    return groups


class EarlyStop:
    """Fed each progress point of a challenger run; sets `stop` when a check says it is behind.

    Keeps the run's curve; `stopping_check` is the check that stopped it (None while it runs
    on), `checks` every check made."""

    def __init__(self, ref: Reference, stop: threading.Event) -> None:
        self.ref, self.stop = ref, stop
        self.curve = RunCurve()
        self.checks_done = 0
        self.stopping_check: PruneCall | None = None
        self.checks: list[PruneCall] = []
        self.elapsed_s: float | None = None  # the latest line's elapsed seconds, if printed

    def add(self, fraction: float, point: ProgressPoint) -> None:
        self.curve.add(fraction, point.loss, float(point.step))
        if self.stopping_check is not None:
            return
        if point.elapsed_s is not None:
            self.elapsed_s = point.elapsed_s
        index = next_check(fraction, self.checks_done, self.ref.policy)
        if index is None:
            return
        self.checks_done = index + 1
        place = placer(fraction, point.step)  # every curve read at this run's steps
        ratio = self.speed_ratio(fraction, point.step)
        speed_differs = ratio is not None and not agrees(ratio, 1.0, self.ref.tolerance)
        outcome = check(place(self.curve.points()), [place(c) for c in self.ref.curves],
                        index, self.ref.level, self.ref.policy, category=self.ref.category,
                        speed_off=speed_differs,
                        earlier=[[place(c) for c in g] for g in self.ref.earlier])
        self.checks.append(outcome)
        logger.info("early-stop check %d: %s", index, outcome.reason())
        if outcome.stop:
            self.stopping_check = outcome
            self.stop.set()

    def speed_ratio(self, fraction: float, step: int) -> float | None:
        """Steps done by `fraction` against the incumbent's runs' mean at that fraction (equal
        time, so a ratio of steps per second); None when none of them reaches it."""
        incumbent_steps = [s for c in self.ref.curves
                           if (s := step_at(c, fraction)) is not None]
        if not incumbent_steps or step <= 0:
            return None
        mean = statistics.fmean(incumbent_steps)
        return step / mean if mean > 0 else None
