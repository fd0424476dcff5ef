"""The experiment page's curve against the incumbent: a change's loss by fraction of the budget
over the band (min–max) of the runs of the commit it was built on, each early-stop check its
runs passed (a dot at the loss the rule read there), and the check that stopped a run (the
fraction its stop reason names, the loss at that check: where the rule judged, not where the
run's process ended).

Reads the runs' recorded curves (runs.curve) through the store: the experiment's own runs and
those of the kept experiment (or baseline) that made its base commit; draws inline SVG.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from markupsafe import Markup, escape

from agent.core.domain import CurvePoints, Experiment, ExperimentStatus, Run, RunStatus, Sweep
from agent.engine.early_stop import REFERENCE_STATUSES, placer, step_at
from agent.rules.prune import PrunePolicy, loss_over, matched
from db.reads import Reads

GRID = 60  # fractions of the budget the band is drawn at
REFERENCE = REFERENCE_STATUSES
FROM_F = 0.15  # the y axis fits the curves from this fraction of the budget on
SMOOTH = 0.05  # the band: each curve's median over this much of the budget (drawing only)


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


def band(curves: Sequence[CurvePoints]) -> list[tuple[float, float, float]]:
    """(fraction, min, max) of the curves' loss at each grid fraction reached by two or more
    (each curve's median over the SMOOTH before it)."""
    out = []
    for i in range(1, GRID + 1):
        f = i / GRID
        here = [v for c in curves if (v := loss_over([(p[0], p[1]) for p in c],
                                                     (f - SMOOTH, f))) is not None]
        if len(here) >= 2:
            out.append((f, min(here), max(here)))
    return out


def band_svg(mine: Sequence[Run], theirs: Sequence[Run], width: int = 640,
             height: int = 220, *, policy: PrunePolicy | None = None,
             judged: bool = True) -> Markup | None:
    """The change's runs' curves over the incumbent's band, a dot at each check a run passed
    (when its runs were `judged`: `prune = "auto"`) and a marker at the check that stopped
    one. None when there is nothing to compare (no curve, or fewer than two incumbent runs)."""
    policy = policy or PrunePolicy()
    zone = band([r.curve for r in theirs if r.curve])
    reference = [r.curve for r in theirs if r.curve]
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
        parts += _checks(r, policy, judged, sx, sy, (mt, height - mb), reference)
    parts.append("</svg>")
    return Markup("".join(parts))


def _checks(r: Run, policy: PrunePolicy, judged: bool, sx: Callable[[float], float],
            sy: Callable[[float], float], ys: tuple[float, float],
            reference: Sequence[CurvePoints]) -> list[str]:
    """The run's check dots and, for a pruned run, the marker of the check that stopped it
    (at its curve's end when its record names no check: a run recorded before it did); each
    at the run's loss over the part as the check reads it: every curve at the run's steps
    (agent.engine.early_stop.placer), matched to the `reference` curves' points."""
    curve = [(p[0], p[1]) for p in r.curve or ()]
    named = r.stop_fraction if r.status is RunStatus.PRUNED else None
    stop = None if named is None else _snap(named, policy.checks)
    last = curve[-1][0] if curve else 0.0
    out = []
    for i, f in enumerate(policy.checks if judged else ()):
        v = _read(r, reference, policy, i)
        if v is None or f > (stop if stop is not None else last) + 1e-9 or f == stop:
            continue
        out.append(f'<circle class="check" data-fraction="{f:g}" data-loss="{v:.6g}" '
                   f'cx="{sx(f):.1f}" cy="{sy(v):.1f}" r="2.5"><title>run {r.id}: checked at '
                   f'{round(f * 100)} % of the budget, its loss since the check before '
                   f'{v:.4g}; went on</title></circle>')
    if r.status is RunStatus.PRUNED and curve:
        v = _read(r, reference, policy, policy.checks.index(stop)) if stop in policy.checks \
            else None
        f, v = (stop, v) if stop is not None and v is not None else curve[-1]
        out.append(f'<g class="stopped"><line x1="{sx(f):.1f}" x2="{sx(f):.1f}" y1="{ys[0]}" '
                   f'y2="{ys[1]}"/><circle data-fraction="{f:g}" data-loss="{v:.6g}" '
                   f'cx="{sx(f):.1f}" cy="{sy(v):.1f}" r="4"/><title>'
                   f'{escape(r.note or "stopped")}</title></g>')
    return out


def _read(r: Run, reference: Sequence[CurvePoints], policy: PrunePolicy,
          index: int) -> float | None:
    """The run's loss over check `index`'s part as the check read it (agent.engine.early_stop:
    every curve placed by the run's own steps, then matched)."""
    f = policy.checks[index]
    own = r.curve or ()
    place = placer(f, step_at(own, f))
    return matched(place(own), [place(c) for c in reference], policy.part(index)).loss


def _snap(named: float, checks: Sequence[float]) -> float:
    """The policy's own check fraction nearest the recorded one (else the recorded one)."""
    near = min(checks, key=lambda f: abs(f - named))
    return near if abs(near - named) < 0.006 else named


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
