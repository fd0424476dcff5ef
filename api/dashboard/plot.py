"""Inline SVG charts drawn on the server: the sweep's progress plot and a run's loss curve.

Pure: stdlib + markupsafe (for the Markup type only). Every text that reaches the SVG is
escaped. Not guaranteed: pretty ticks for every range (they are evenly spaced, not "nice").
Above MAX_MARKS runs the progress plot is downsampled (plot_data.downsample): every kept run
stays a mark; the rest keep, per bucket of consecutive runs, their lowest and highest metric
and their first crash and timeout, and a grey band draws each bucket's min–max envelope. The
y-axis spans what is drawn, the runs' dots included, past Tukey's far-out fences only
(y_range). The plot is drawn from a PlotFold (plot_data.py), which a finish adds its point to.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

from markupsafe import Markup

from agent.analysis.evidence import SweepEvidence
from agent.core.domain import ExperimentStatus

from .plot_data import RUNS, Envelope, PlotFold, PlotPoint
from .plot_data import downsample as downsample
from .plot_data import scored as is_scored

PLOT_W, PLOT_H = 960, 340
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 72, 20, 18, 46
CRASH_BAND_PX = 30  # crashes sit in a band under the metric area
MAX_MARKS = 1000  # runs drawn one mark each; above this the plot is downsampled


def _envelope_path(envelopes: Sequence[Envelope], sx, sy) -> str:  # type: ignore[no-untyped-def]
    """One closed path: along each bucket's highest metric, back along the lowest."""
    if not envelopes:
        return ""
    top = [f"{sx(e.n_lo) - 1:.1f},{sy(e.hi) - 1:.1f}L{sx(e.n_hi) + 1:.1f},{sy(e.hi) - 1:.1f}"
           for e in envelopes]
    bottom = [f"{sx(e.n_hi) + 1:.1f},{sy(e.lo) + 1:.1f}L{sx(e.n_lo) - 1:.1f},{sy(e.lo) + 1:.1f}"
              for e in reversed(envelopes)]
    return f'<path class="envelope" d="M{"L".join(top)}L{"L".join(bottom)}Z"/>'


def _fmt(v: float) -> str:
    return f"{v:.4f}" if abs(v) < 1000 else f"{v:.4g}"


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[tuple[float, str]]:
    """Round tick values (1, 2, 2.5 or 5 × 10^k apart) inside [lo, hi], with their labels."""
    raw = (hi - lo) / target
    if not (raw > 0 and math.isfinite(raw)):
        return [(lo, _fmt(lo))]
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    decimals = max(0, -math.floor(math.log10(step) + 1e-9) + (1 if step / mag == 2.5 else 0))
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    for k in range(first, first + target * 3):
        v = k * step
        if v > hi + step * 1e-9:
            break
        ticks.append((v, f"{v:.{decimals}f}"))
    return ticks


FENCE_IQR = 3.0  # Tukey's far-out fences: a value this many IQRs past a quartile is an outlier


def y_range(values: Sequence[float], kept: Sequence[float]) -> tuple[float, float]:
    """The y-axis: every kept mean and every value (each mean and each run drawn) within
    FENCE_IQR × IQR of the quartiles (Tukey's far-out fences), plus 6 % padding; a value
    outside is drawn as a triangle on the edge it passed, so one crash-level run cannot
    flatten the rest. With no spread in the middle half, no fence: every value is spanned."""
    ordered = sorted(v for v in values if math.isfinite(v))
    if not ordered:
        return 0.0, 1.0
    q1, q3 = ordered[(len(ordered) - 1) // 4], ordered[3 * (len(ordered) - 1) // 4]
    fence = FENCE_IQR * (q3 - q1) if q3 > q1 else math.inf
    inside = [v for v in ordered if q1 - fence <= v <= q3 + fence]
    inside += [v for v in kept if math.isfinite(v)]
    lo, hi = min(inside), max(inside)
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5 * max(abs(lo) * 0.01, 1e-6), hi + 0.5 * max(abs(hi) * 0.01, 1e-6)
    pad = (hi - lo) * 0.06
    return lo - pad, hi + pad


def _label_of(fold: PlotFold, p: PlotPoint, metric_name: str) -> str:
    """The mark's tooltip, escaped (kept in the fold: a finished experiment's label does not
    change)."""
    hit = fold.labels.get(p.exp.id)
    if hit is None or hit[0] != metric_name:
        hit = fold.labels[p.exp.id] = (metric_name, escape(_label(p, metric_name)))
    return hit[1]


def _label(p: PlotPoint, metric_name: str) -> str:
    e = p.exp
    parts = [
        f"#{e.id} ({e.status.value}{'/' + e.crash_kind.value if e.crash_kind else ''})",
        e.description,
    ]
    record = e.record
    if e.metric is not None:
        n = record.n if record is not None else 0
        parts.append(f"{metric_name} {e.metric:.6f}" + (
            f" (measured: mean of {n} runs)" if n > 1 else " (measured on 1 run)" if n else ""))
    if e.delta is not None:
        se = f" ± {record.se:.3g}" if record is not None and record.se is not None else ""
        parts.append(f"Δ {e.delta:+.6f}{se} vs its incumbent runs (inferred)")
    return " · ".join(parts)


def draw_progress(fold: PlotFold, metric_name: str, href: str = "/ui/experiments/{id}#diff",
                  evidence: SweepEvidence | None = None, best: float | None = None) -> Markup:
    """The progress plot of the runs folded into `fold` (a PlotFold of the sweep's
    experiments): x = run number, y = metric (the mean of the experiment's runs); kept green,
    discarded grey, crashes and timeouts as red/purple marks in the bottom band; the best line
    steps to the best each experiment was compared with (its record's) and ends at `best`, the
    sweep's best now. Each mark links to `href`. With `evidence`, every run is a small dot and
    each kept mean carries its 95 % interval as a band."""
    points = fold.points
    if not points:
        return Markup('<p class="empty">No finished runs yet.</p>')
    kept = fold.kept
    last_n, total = points[-1].n, len(points)
    downsampled = total > MAX_MARKS
    envelopes: list[Envelope] = []
    if downsampled:
        points, envelopes = fold.buckets.drawn(fold.kept_all)
    scored = [p for p in points if is_scored(p)]
    # a downsampled plot skips lone runs' dots (each is under its experiment's mark)
    dots = _dot_values(scored, evidence, min_runs=2 if downsampled else 1)
    means = [p.exp.metric for p in scored if p.exp.metric is not None]
    lo, hi = y_range([*means, *(v for _, vs in dots for v in vs)],
                     [p.exp.metric for p in kept if p.exp.metric is not None])
    x0, x1 = MARGIN_L, PLOT_W - MARGIN_R
    y_top, y_bot = MARGIN_T, PLOT_H - MARGIN_B - CRASH_BAND_PX
    n_max = max(points[-1].n, 2)

    def sx(n: int) -> float:
        return x0 + (n - 1) / (n_max - 1) * (x1 - x0)

    def sy(v: float) -> float:
        return y_bot - (min(max(v, lo), hi) - lo) / (hi - lo) * (y_bot - y_top)

    out = _frame(metric_name, n_max, lo, hi, sx, sy)
    if downsampled:
        out.append(_envelope_path(envelopes, sx, sy))
        out.append(f'<text class="tick note" x="{x1}" y="{y_top - 4}" text-anchor="end">'
                   f"{len(points):,} of {total:,} runs drawn: every kept one; of the rest, "
                   "each stretch's lowest and highest (band) and first crash</text>")
    if evidence is not None:
        out.extend(_load_shifts(points, sx, y_top, evidence))
        out.extend(_best_band(kept, last_n, sx, sy, evidence, one_path=downsampled))
        out.extend(_run_dots(dots, sx, sy, lo, hi))
    out.extend(_best_line(fold.steps, last_n, sx, sy, best))
    # Discarded first so that kept marks are drawn on top.
    order = sorted(points, key=lambda p: p.exp.status is ExperimentStatus.KEPT)
    for p in order:
        out.append(_mark(p, sx(p.n), sy, y_bot, lo, hi, _label_of(fold, p, metric_name), href))
    out.append("</svg>")
    return Markup("".join(out))


def _best_line(steps: Sequence[tuple[int, float]], last_n: int, sx, sy,  # type: ignore[no-untyped-def]
               best: float | None) -> list[str]:
    """The best as each experiment's comparison saw it (its record's best then), stepping
    where that changed, then the best now (`best`) at the last run."""
    if not steps:
        return []
    d = [f"M{sx(steps[0][0]):.1f},{sy(steps[0][1]):.1f}"]
    for n, v in steps[1:]:
        d.append(f"H{sx(n):.1f}V{sy(v):.1f}")
    d.append(f"H{sx(last_n):.1f}")
    if best is not None and best != steps[-1][1]:
        d.append(f"V{sy(best):.1f}")
    end = f"{best if best is not None else steps[-1][1]:.6f}"
    return [f'<path class="best" data-best="{end}" d="{"".join(d)}"><title>the best each '
            f"experiment was compared with; the best now {end}</title></path>"]


def _frame(metric_name: str, n_max: int, lo: float, hi: float, sx, sy) -> list[str]:  # type: ignore[no-untyped-def]
    """The plot's opening tag, crash band, grid, ticks and axis labels."""
    x0, x1 = MARGIN_L, PLOT_W - MARGIN_R
    y_top, y_bot = MARGIN_T, PLOT_H - MARGIN_B - CRASH_BAND_PX
    out = [
        f'<svg class="progress" viewBox="0 0 {PLOT_W} {PLOT_H}" role="img" '
        f'aria-label="progress plot: {escape(metric_name)} by run number" '
        f'preserveAspectRatio="xMidYMid meet">'
    ]
    out.append(
        f'<rect class="band" x="{x0}" y="{y_bot + 10}" width="{x1 - x0}" '
        f'height="{CRASH_BAND_PX - 12}"/>'
    )
    for v, text in nice_ticks(lo, hi):  # y grid and ticks
        y = sy(v)
        out.append(
            f'<line class="grid" x1="{x0}" x2="{x1}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">'
            f"{text}</text>"
        )
    step = max(1, math.ceil(n_max / 10))
    for n in range(1, n_max + 1, step):
        out.append(
            f'<text class="tick" x="{sx(n):.1f}" y="{PLOT_H - MARGIN_B + 16}" '
            f'text-anchor="middle">{n}</text>'
        )
    out.append(f'<text class="tick" x="{x0 - 6}" y="{y_bot + 23}" text-anchor="end">crash</text>')
    out.append(
        f'<text class="axis" x="{(x0 + x1) / 2}" y="{PLOT_H - 8}" text-anchor="middle">'
        f'experiment #</text><text class="axis" x="14" y="{(y_top + y_bot) / 2}" '
        f'text-anchor="middle" transform="rotate(-90 14 {(y_top + y_bot) / 2})">'
        f"{escape(metric_name)}</text>"
    )
    return out


def _best_band(kept, last_n, sx, sy, evidence: SweepEvidence, one_path: bool = False  # type: ignore[no-untyped-def]
               ) -> list[str]:
    """The 95 % interval of each kept mean, drawn along its stretch of the best line: a rect
    per keep, or (`one_path`, for a downsampled plot) one path of their outlines."""
    out, shapes = [], []
    for p, nxt in zip(kept, [*kept[1:], None], strict=True):
        ev = evidence.experiments.get(p.exp.id)
        if ev is None or ev.ci is None or ev.mean is None:
            continue
        x_a, x_b = sx(p.n), sx(nxt.n if nxt else last_n)
        y_a, y_b = sy(ev.mean + ev.ci), sy(ev.mean - ev.ci)
        if one_path:
            shapes.append(f"M{x_a:.0f},{min(y_a, y_b):.0f}H{max(x_b, x_a + 1):.0f}"
                          f"V{max(y_a, y_b):.0f}H{x_a:.0f}Z")
            continue
        out.append(
            f'<rect class="best-band" data-id="{p.exp.id}" x="{x_a:.1f}" y="{min(y_a, y_b):.1f}" '
            f'width="{max(x_b - x_a, 2.0):.1f}" height="{abs(y_b - y_a):.1f}"/>'
        )
    if shapes:
        out.append(f'<path class="best-band" d="{"".join(shapes)}"/>')
    return out


def _load_shifts(points, sx, y_top: float, evidence: SweepEvidence) -> list[str]:  # type: ignore[no-untyped-def]
    """A stripe along the top over each stretch of runs the keep rule compared beside the
    incumbent in other machine conditions (a load shift), with what it did in its title."""
    spans: list[list[PlotPoint]] = []
    for p in points:
        ev = evidence.experiments.get(p.exp.id) if p.exp.status in RUNS else None
        if ev is None or not (ev.set_aside or ev.pairs):
            continue
        if spans and spans[-1][-1].n == p.n - 1:
            spans[-1].append(p)
        else:
            spans.append([p])
    out = []
    for span in spans:
        a, b = span[0].n, span[-1].n
        x = sx(a) - 3
        width = max(6.0, sx(b) - sx(a) + 6)
        what = f"run {a}" if a == b else f"runs {a}–{b}"
        out.append(f'<rect class="load" x="{x:.1f}" y="{y_top - 9:.1f}" width="{width:.1f}" '
                   f'height="5"><title>load shift: {what} measured while the machine ran '
                   "otherwise; compared beside the incumbent in the same conditions</title>"
                   "</rect>")
    return out


def _dot_values(scored: Sequence[PlotPoint], evidence: SweepEvidence | None, min_runs: int = 1
                ) -> list[tuple[PlotPoint, tuple[float, ...]]]:
    """Each scored point with the finite values of its runs, for those with at least
    `min_runs` runs (none without evidence)."""
    if evidence is None:
        return []
    out = []
    for p in scored:
        ev = evidence.experiments.get(p.exp.id)
        if ev is not None and len(ev.runs) >= min_runs:
            out.append((p, tuple(v for v in ev.runs if math.isfinite(v))))
    return out


def _run_dots(dots, sx, sy, lo: float, hi: float) -> list[str]:  # type: ignore[no-untyped-def]
    """Every run of every scored experiment (`dots`: _dot_values) as a small dot at the
    experiment's x; a run off the y-axis (y_range's outliers) is a small triangle on the edge
    it passed, pointing out."""
    out = []
    for p, values in dots:
        x = sx(p.n)
        for v in values:
            if lo <= v <= hi:
                out.append(f'<circle class="run" data-id="{p.exp.id}" cx="{x:.1f}" '
                           f'cy="{sy(v):.1f}" r="2"><title>run: {v:.6f}</title></circle>')
                continue
            y, tip = (sy(lo), "l3,-5h-6z") if v < lo else (sy(hi), "l3,5h-6z")
            out.append(f'<path class="run clipped" data-id="{p.exp.id}" d="M{x:.1f},{y:.1f}'
                       f'{tip}"><title>run: {v:.6f} (off the axis)</title></path>')
    return out


def _mark(
    p: PlotPoint,
    x: float,
    sy: Callable[[float], float],
    y_bot: float,
    lo: float,
    hi: float,
    label: str,  # the tooltip, escaped
    href: str,
) -> str:
    e = p.exp
    attrs = (  # the tooltip reads <title>: the label is written once
        f'class="pt {e.status.value}" href="{escape(href.format(id=e.id))}" '
        f'data-id="{e.id}" data-n="{p.n}"'
    )
    if (
        e.status in (ExperimentStatus.CRASHED, ExperimentStatus.TIMEOUT)
        or e.metric is None
        or not math.isfinite(e.metric)
    ):
        y = y_bot + 19
        shape = (
            f'<path d="M{x - 4:.1f},{y - 4:.1f}l8,8m0,-8l-8,8"/>'
            f'<rect class="hit" x="{x - 6:.1f}" y="{y - 6:.1f}" width="12" height="12"/>'
        )
    elif e.metric > hi:  # an outlier (y_range): a triangle on the top edge, pointing out
        y = sy(hi)
        shape = f'<path d="M{x:.1f},{y - 1:.1f}l5,9h-10z"/>'
    elif e.metric < lo:  # ... or on the bottom edge
        y = sy(lo)
        shape = f'<path d="M{x:.1f},{y + 1:.1f}l5,-9h-10z"/>'
    else:
        r = 5.5 if e.status is ExperimentStatus.KEPT else 3.8
        shape = f'<circle cx="{x:.1f}" cy="{sy(e.metric):.1f}" r="{r}"/>'
    return f"<a {attrs}><title>{label}</title>{shape}</a>"


def loss_svg(points: Sequence[tuple[int, float]], width: int = 360, height: int = 120) -> Markup:
    """A small loss-vs-step curve; empty text when there are fewer than two finite points."""
    pts = [(s, v) for s, v in points if math.isfinite(v)]
    if len(pts) < 2:
        return Markup('<p class="empty">No loss points yet.</p>')
    ml, mr, mt, mb = 46, 8, 8, 20
    s0, s1 = pts[0][0], max(pts[-1][0], pts[0][0] + 1)
    lo, hi = min(v for _, v in pts), max(v for _, v in pts)
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5

    def sx(s: int) -> float:
        return ml + (s - s0) / (s1 - s0) * (width - ml - mr)

    def sy(v: float) -> float:
        return height - mb - (v - lo) / (hi - lo) * (height - mt - mb)

    line = " ".join(f"{sx(s):.1f},{sy(v):.1f}" for s, v in pts)
    return Markup(
        f'<svg class="loss" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="training loss by step, last {_fmt(pts[-1][1])}">'
        f'<line class="grid" x1="{ml}" x2="{width - mr}" y1="{sy(lo):.1f}" y2="{sy(lo):.1f}"/>'
        f'<line class="grid" x1="{ml}" x2="{width - mr}" y1="{sy(hi):.1f}" y2="{sy(hi):.1f}"/>'
        f'<text class="tick" x="{ml - 4}" y="{sy(hi) + 4:.1f}" text-anchor="end">{_fmt(hi)}</text>'
        f'<text class="tick" x="{ml - 4}" y="{sy(lo) + 4:.1f}" text-anchor="end">{_fmt(lo)}</text>'
        f'<text class="tick" x="{ml}" y="{height - 4}">step {s0}</text>'
        f'<text class="tick" x="{width - mr}" y="{height - 4}" text-anchor="end">step {s1}</text>'
        f'<polyline class="curve" points="{line}"/></svg>'
    )
