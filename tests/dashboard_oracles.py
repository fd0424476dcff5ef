"""Whole-sweep versions of the dashboard's folded parts, computed in one pass: the oracles the
folds (api/dashboard/fold.py, plot_data.PlotFold, rollup.Rollup) are checked against."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from markupsafe import Markup

from agent.analysis.evidence import SweepEvidence
from agent.analysis.insights_fold import digest
from agent.core.domain import Experiment, ExperimentStatus, Sweep, utcnow
from api.dashboard.fold import Rollup
from api.dashboard.plot import draw_progress
from api.dashboard.plot_data import PlotFold
from api.dashboard.views import insights_panel_of


def progress_svg(experiments: Sequence[Experiment], metric_name: str,
                 href: str = "/ui/experiments/{id}#diff",
                 evidence: SweepEvidence | None = None) -> Markup:
    """The progress plot of `experiments`, folded in one pass."""
    fold = PlotFold()
    for e in experiments:
        fold.add(e)
    return draw_progress(fold, metric_name, href, evidence)


def rollup_of(experiments: Sequence[Experiment], running_time: bool = True) -> Rollup:
    """Counts and training time; without `running_time` the running rows are counted but
    their time so far is left out (a cached rollup adds it when the page is drawn)."""
    now = utcnow()
    r = Rollup()
    for e in experiments:
        running = e.status is ExperimentStatus.RUNNING and not running_time
        r.add(e.status.value, None if running else e.run_started_at, e.run_ended_at, now)
    return r


def insights_panel(sweep: Sweep, exps: list[Experiment]) -> list[dict[str, Any]]:
    """The insights panel of the whole sweep's digest."""
    return insights_panel_of(digest(sweep, exps))
