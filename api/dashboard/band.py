"""The experiment page's curve against the incumbent: a change's loss by fraction of the budget
over the band (min–max) of the runs of the commit it was built on, and where it was stopped.

Reads the runs' recorded curves (runs.curve) through the store: the experiment's own runs and
those of the kept experiment (or baseline) that made its base commit; draws inline SVG.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from markupsafe import Markup, escape

from agent.core.domain import CurvePoints, Experiment, ExperimentStatus, Run, RunStatus, Sweep
from agent.engine.early_stop import REFERENCE_STATUSES
from agent.rules.prune import PrunePolicy, loss_at
from db.reads import Reads

GRID = 60  # fractions of the budget the band is drawn at
REFERENCE = REFERENCE_STATUSES
FROM_F = 0.15  # the y axis fits the curves from this fraction of the budget on


def incumbent_runs(reads: Reads, sweep: Sweep, e: Experiment) -> list[Run]:
    """The finished runs of the commit `e` was built on that have a curve (none for a
    baseline, or when no kept experiment made that commit)."""
    if e.is_baseline or not e.base_commit:
        return []
    makers = [x for x in reads.store.list_experiments(sweep.id, [ExperimentStatus.KEPT])
              if x.commit == e.base_commit]
    first = reads.store.list_experiments(sweep.id, limit=1)
    makers += [x for x in first if x.is_baseline and x.commit == e.base_commit]
    runs = [r for x in makers for r in reads.store.list_runs(experiment_id=x.id)]
    return [r for r in runs if r.commit == e.base_commit and r.status in REFERENCE and r.curve]


def band(curves: Sequence[CurvePoints], window: float) -> list[tuple[float, float, float]]:
    """(fraction, min, max) of the curves' loss at each grid fraction reached by two or more."""
    out = []
    for i in range(1, GRID + 1):
        f = i / GRID
        here = [v for c in curves if (v := loss_at([(p[0], p[1]) for p in c], f, window))
                is not None]
        if len(here) >= 2:
            out.append((f, min(here), max(here)))
    return out


def band_svg(mine: Sequence[Run], theirs: Sequence[Run], width: int = 640,
             height: int = 220) -> Markup | None:
    """The change's runs' curves over the incumbent's band; a marker where a run was stopped
    early. None when there is nothing to compare (no curve, or fewer than two incumbent runs)."""
    policy = PrunePolicy()
    zone = band([r.curve for r in theirs if r.curve], policy.window)
    lines = [r for r in mine if r.curve]
    if not zone or not lines:
        return None
    lo_v, hi_v = _range(zone, lines)
    ml, mr, mt, mb = 46, 8, 8, 22

    def sx(f: float) -> float:
        return ml + min(max(f, 0.0), 1.0) * (width - ml - mr)

    def sy(v: float) -> float:
        v = min(max(v, lo_v), hi_v)
        return height - mb - (v - lo_v) / (hi_v - lo_v) * (height - mt - mb)

    area = ([f"{sx(f):.1f},{sy(hi):.1f}" for f, _, hi in zone]
            + [f"{sx(f):.1f},{sy(lo):.1f}" for f, lo, _ in reversed(zone)])
    parts = [
        f'<svg class="loss band" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="training loss by fraction of the budget against the incumbent\'s '
        f'{len(theirs)} runs">',
        f'<polygon class="band" points="{" ".join(area)}"><title>the incumbent\'s '
        f'{len(theirs)} runs: min–max</title></polygon>',
        f'<text class="tick" x="{ml - 4}" y="{sy(hi_v) + 4:.1f}" text-anchor="end">'
        f'{hi_v:.3g}</text>',
        f'<text class="tick" x="{ml - 4}" y="{sy(lo_v) + 4:.1f}" text-anchor="end">'
        f'{lo_v:.3g}</text>',
        f'<text class="tick" x="{ml}" y="{height - 4}">0 %</text>',
        f'<text class="tick" x="{width - mr}" y="{height - 4}" text-anchor="end">100 % of the '
        'budget</text>',
    ]
    for f in policy.checks:
        parts.append(f'<line class="grid" x1="{sx(f):.1f}" x2="{sx(f):.1f}" y1="{mt}" '
                     f'y2="{height - mb}"/>')
    for r in lines:
        pts = " ".join(f"{sx(p[0]):.1f},{sy(p[1]):.1f}" for p in r.curve or ()
                       if math.isfinite(p[1]))
        parts.append(f'<polyline class="curve" points="{pts}"><title>run {r.id} '
                     f'({r.role.value}, seed {r.seed})</title></polyline>')
        if r.status is RunStatus.PRUNED and r.curve:
            f, v = r.curve[-1][0], r.curve[-1][1]
            parts.append(f'<g class="stopped"><line x1="{sx(f):.1f}" x2="{sx(f):.1f}" '
                         f'y1="{mt}" y2="{height - mb}"/><circle cx="{sx(f):.1f}" '
                         f'cy="{sy(v):.1f}" r="4"/><title>{escape(r.note or "stopped")}'
                         '</title></g>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _range(zone: Sequence[tuple[float, float, float]], lines: Sequence[Run]
           ) -> tuple[float, float]:
    """The y range of the band and the curves from FROM_F of the budget on (the first steps'
    high loss would flatten the part that is judged; earlier points are clipped), never empty."""
    values = [v for f, lo, hi in zone if f >= FROM_F for v in (lo, hi)]
    values += [p[1] for r in lines for p in r.curve or () if p[0] >= FROM_F
               and math.isfinite(p[1])]
    if not values:
        values = [v for _, lo, hi in zone for v in (lo, hi)]
    lo, hi = min(values), max(values)
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    return lo, hi
