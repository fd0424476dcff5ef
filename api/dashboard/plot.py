"""Inline SVG charts drawn on the server: the sweep's progress plot and a run's loss curve.

Pure: stdlib + markupsafe (for the Markup type only). Every text that reaches the SVG is
escaped. Not guaranteed: pretty ticks for every range (they are evenly spaced, not "nice").
Above MAX_MARKS runs the progress plot is downsampled (`downsample`): every kept run stays a
mark; the rest keep, per bucket of consecutive runs, their lowest and highest metric and their
first crash and timeout, and a grey band draws each bucket's min–max envelope.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from markupsafe import Markup

from agent.domain import Experiment, ExperimentStatus
from agent.evidence import SweepEvidence
from agent.folds import Ordered

PLOT_W, PLOT_H = 960, 340
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 72, 20, 18, 46
CRASH_BAND_PX = 30  # crashes sit in a band under the metric area
MAX_MARKS = 1000  # runs drawn one mark each; above this the plot is downsampled
BUCKETS = 160  # buckets of consecutive runs when downsampled (~5.5 px each)
RUNS = (
    ExperimentStatus.KEPT,
    ExperimentStatus.DISCARDED,
    ExperimentStatus.CRASHED,
    ExperimentStatus.TIMEOUT,
)


@dataclass(frozen=True)
class PlotPoint:
    n: int  # run number within the sweep (x)
    exp: Experiment


@dataclass(frozen=True)
class Envelope:
    """The non-kept scored runs n_lo..n_hi of one bucket: their lowest and highest metric."""

    n_lo: int
    n_hi: int
    lo: float
    hi: float


def _scored(p: PlotPoint) -> bool:
    m = p.exp.metric
    return m is not None and math.isfinite(m) and p.exp.status in (
        ExperimentStatus.KEPT, ExperimentStatus.DISCARDED)


def bucket_width(n_max: int, buckets: int = BUCKETS) -> int:
    """Runs per bucket: the smallest power of two that puts 1..n_max in at most `buckets`
    buckets. Buckets are aligned ((n - 1) // width), so as a sweep grows they only merge in
    pairs: a plot's buckets can be kept as running state and appended to (PlotFold)."""
    width = 1
    while -(-n_max // width) > buckets:
        width *= 2
    return width


class Bucket:
    """One bucket of consecutive runs: its lowest and highest non-kept scored run (the first of
    equals), their first and last run number, and the first run of each unscored status."""

    __slots__ = ("low", "high", "n_lo", "n_hi", "firsts")

    def __init__(self) -> None:
        self.low: PlotPoint | None = None
        self.high: PlotPoint | None = None
        self.n_lo = self.n_hi = 0
        self.firsts: dict[str, PlotPoint] = {}

    def add(self, p: PlotPoint) -> None:
        if _scored(p):
            m = p.exp.metric
            if self.low is None or self.high is None:
                self.low = self.high = p
                self.n_lo = p.n
            elif m < self.low.exp.metric:  # type: ignore[operator]
                self.low = p
            elif m > self.high.exp.metric:  # type: ignore[operator]
                self.high = p
            self.n_hi = p.n
        else:
            self.firsts.setdefault(p.exp.status.value, p)

    def merged(self, right: Bucket) -> Bucket:
        """This bucket followed by `right` (the earlier of equal extremes wins)."""
        out = Bucket()
        out.firsts = {**right.firsts, **self.firsts}
        if self.low is None or self.high is None:
            out.low, out.high, out.n_lo, out.n_hi = right.low, right.high, right.n_lo, right.n_hi
            return out
        out.low, out.high, out.n_lo, out.n_hi = self.low, self.high, self.n_lo, self.n_hi
        if right.low is not None and right.high is not None:
            if right.low.exp.metric < self.low.exp.metric:  # type: ignore[operator]
                out.low = right.low
            if right.high.exp.metric > self.high.exp.metric:  # type: ignore[operator]
                out.high = right.high
            out.n_hi = right.n_hi
        return out


class Buckets:
    """A plot's buckets as running state: `add` run numbers in order; the width doubles (and
    neighbouring buckets merge) as the runs outgrow `count` buckets."""

    def __init__(self, count: int = BUCKETS) -> None:
        self.count, self.width, self.n_max = count, 1, 0
        self.by_index: dict[int, Bucket] = {}

    def add(self, p: PlotPoint) -> None:
        self.n_max = p.n
        while -(-self.n_max // self.width) > self.count:
            self._double()
        if p.exp.status is not ExperimentStatus.KEPT:
            b = (p.n - 1) // self.width
            found = self.by_index.get(b)  # possibly shared with a copy: changed as a copy
            found = self.by_index[b] = Bucket() if found is None else _copied(found)
            found.add(p)

    def _double(self) -> None:
        merged: dict[int, Bucket] = {}
        for b in sorted(self.by_index):
            have = merged.get(b // 2)
            merged[b // 2] = self.by_index[b] if have is None else have.merged(self.by_index[b])
        self.width *= 2
        self.by_index = merged

    def copy(self) -> Buckets:
        """A copy to append to (a bucket is replaced, never changed, by `add`)."""
        out = Buckets(self.count)
        out.width, out.n_max = self.width, self.n_max
        out.by_index = dict(self.by_index)
        return out

    def drawn(self, kept: Sequence[PlotPoint]) -> tuple[list[PlotPoint], list[Envelope]]:
        keep = {p.n: p for p in kept}
        envelopes = []
        for b in sorted(self.by_index):
            x = self.by_index[b]
            if x.low is not None and x.high is not None:
                keep[x.low.n], keep[x.high.n] = x.low, x.high
                envelopes.append(Envelope(x.n_lo, x.n_hi, x.low.exp.metric,  # type: ignore[arg-type]
                                          x.high.exp.metric))  # type: ignore[arg-type]
        for b in sorted(self.by_index):
            for p in self.by_index[b].firsts.values():
                keep[p.n] = p
        return [keep[n] for n in sorted(keep)], envelopes


def _copied(b: Bucket) -> Bucket:
    out = Bucket()
    out.low, out.high, out.n_lo, out.n_hi, out.firsts = b.low, b.high, b.n_lo, b.n_hi, \
        dict(b.firsts)
    return out


def downsample(points: Sequence[PlotPoint], buckets: int = BUCKETS
               ) -> tuple[list[PlotPoint], list[Envelope]]:
    """Every kept point; of the others, per bucket of consecutive run numbers (bucket_width
    runs each), the lowest and the highest scored one and the first of each unscored status
    (crash, timeout, no metric); with each bucket's envelope of its non-kept scored metrics.
    Points stay in run order."""
    state = Buckets(buckets)
    for p in points:
        state.add(p)
    return state.drawn([p for p in points if p.exp.status is ExperimentStatus.KEPT])


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


def _y_range(ordered: Sequence[float], baseline: float | None) -> tuple[float, float]:
    """Span the kept/discarded metrics (sorted), but don't let one wild outlier flatten the
    rest."""
    lo, hi = ordered[0], ordered[-1]
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    cap = max(p90, baseline if baseline is not None else p90)
    if hi > cap + (cap - lo) * 0.5:
        hi = cap + (cap - lo) * 0.15
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5 * max(abs(lo) * 0.01, 1e-6), hi + 0.5 * max(abs(hi) * 0.01, 1e-6)
    pad = (hi - lo) * 0.06
    return lo - pad, hi + pad


def _label(p: PlotPoint, metric_name: str) -> str:
    e = p.exp
    parts = [
        f"#{e.id} ({e.status.value}{'/' + e.crash_kind.value if e.crash_kind else ''})",
        e.description,
    ]
    if e.metric is not None:
        parts.append(f"{metric_name} {_fmt(e.metric)}")
    if e.delta is not None:
        parts.append(f"delta {e.delta:+.6f}")
    return " · ".join(parts)


class PlotFold:
    """What the progress plot draws of a sweep, as running state: `add` finished experiments in
    id order (others are skipped), `copy` before adding to one that is shared. The run numbers,
    kept points, sorted scored metrics and buckets of the rest only grow, so a finish costs its
    own points, not the sweep's."""

    def __init__(self) -> None:
        self.points: list[PlotPoint] = []
        self.kept: list[PlotPoint] = []  # scored kept points
        self.kept_all: list[PlotPoint] = []  # every kept point, scored or not
        self.scored = Ordered()  # scored metrics
        self.buckets = Buckets()
        self._labels: dict[int, tuple[str, str]] = {}

    def add(self, e: Experiment) -> None:
        if e.status not in RUNS:
            return
        p = PlotPoint(len(self.points) + 1, e)
        self.points.append(p)
        if e.status is ExperimentStatus.KEPT:
            self.kept_all.append(p)
        if _scored(p) and e.metric is not None:
            self.scored.add(e.metric)
            if e.status is ExperimentStatus.KEPT:
                self.kept.append(p)
        self.buckets.add(p)

    def label(self, p: PlotPoint, metric_name: str) -> str:
        """The mark's tooltip, escaped (kept: a finished experiment's label does not change)."""
        hit = self._labels.get(p.exp.id)
        if hit is None or hit[0] != metric_name:
            hit = self._labels[p.exp.id] = (metric_name, escape(_label(p, metric_name)))
        return hit[1]

    def copy(self) -> PlotFold:
        out = PlotFold()
        out._labels = self._labels  # shared: entries are only added
        out.points, out.kept, out.kept_all = list(self.points), list(self.kept), \
            list(self.kept_all)
        out.scored = self.scored.copy()
        out.buckets = self.buckets.copy()
        return out


def progress_svg(
    experiments: Sequence[Experiment],
    metric_name: str,
    baseline: float | None,
    href: str = "/ui/experiments/{id}#diff",
    evidence: SweepEvidence | None = None,
) -> Markup:
    """x = run number, y = metric (the mean of the experiment's runs); kept green on the
    running-best step line, discarded grey, crashes and timeouts as red/purple marks in the
    bottom band. Each mark links to `href`. With `evidence`, every run is a small dot and the
    best line carries its 95 % interval as a band."""
    fold = PlotFold()
    for e in experiments:
        fold.add(e)
    return draw_progress(fold, metric_name, baseline, href, evidence)


def draw_progress(fold: PlotFold, metric_name: str, baseline: float | None,
                  href: str = "/ui/experiments/{id}#diff",
                  evidence: SweepEvidence | None = None) -> Markup:
    """The progress plot (progress_svg) of the runs folded into `fold`."""
    points = fold.points
    if not points:
        return Markup('<p class="empty">No finished runs yet.</p>')
    metrics = fold.scored.values()
    lo, hi = _y_range(metrics, baseline) if metrics else (0.0, 1.0)
    x0, x1 = MARGIN_L, PLOT_W - MARGIN_R
    y_top, y_bot = MARGIN_T, PLOT_H - MARGIN_B - CRASH_BAND_PX
    n_max = max(points[-1].n, 2)

    def sx(n: int) -> float:
        return x0 + (n - 1) / (n_max - 1) * (x1 - x0)

    def sy(v: float) -> float:
        return y_bot - (min(max(v, lo), hi) - lo) / (hi - lo) * (y_bot - y_top)

    out = _frame(metric_name, n_max, lo, hi, sx, sy)
    kept = fold.kept
    last_n, total = points[-1].n, len(points)
    downsampled = total > MAX_MARKS
    if downsampled:
        points, envelopes = fold.buckets.drawn(fold.kept_all)
        out.append(_envelope_path(envelopes, sx, sy))
        out.append(f'<text class="tick note" x="{x1}" y="{y_top - 4}" text-anchor="end">'
                   f"{len(points):,} of {total:,} runs drawn: every kept one; of the rest, "
                   "each stretch's lowest and highest (band) and first crash</text>")
    scored = [p for p in points if _scored(p)]
    if evidence is not None:
        out.extend(_best_band(kept, last_n, sx, sy, evidence, one_path=downsampled))
        out.extend(_run_dots(scored, sx, sy, lo, hi, evidence, min_runs=2 if downsampled else 1))
    out.extend(_best_line(kept, last_n, sx, sy))
    # Discarded first so that kept marks are drawn on top.
    order = sorted(points, key=lambda p: p.exp.status is ExperimentStatus.KEPT)
    for p in order:
        out.append(_mark(p, sx(p.n), sy, y_bot, hi, fold.label(p, metric_name), href))
    out.append("</svg>")
    return Markup("".join(out))


def _best_line(kept, last_n: int, sx, sy) -> list[str]:  # type: ignore[no-untyped-def]
    """The running best: flat until the next keep, then a step."""
    if not kept:
        return []
    d = [f"M{sx(kept[0].n):.1f},{sy(kept[0].exp.metric):.1f}"]
    for p in kept[1:]:
        d.append(f"H{sx(p.n):.1f}V{sy(p.exp.metric):.1f}")
    d.append(f"H{sx(last_n):.1f}")
    return [f'<path class="best" d="{"".join(d)}"/>']


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


def _run_dots(scored, sx, sy, lo: float, hi: float, evidence: SweepEvidence,  # type: ignore[no-untyped-def]
              min_runs: int = 1) -> list[str]:
    """Every run of every scored experiment with at least `min_runs` runs as a small dot at
    the experiment's x (a downsampled plot skips lone runs: their dot is under the mark)."""
    out = []
    for p in scored:
        ev = evidence.experiments.get(p.exp.id)
        runs = ev.runs if ev is not None and len(ev.runs) >= min_runs else ()
        for v in runs:
            if math.isfinite(v):
                out.append(
                    f'<circle class="run" data-id="{p.exp.id}" cx="{sx(p.n):.1f}" '
                    f'cy="{sy(v):.1f}" r="2"><title>run: {_fmt(v)}</title></circle>'
                )
    return out


def _mark(
    p: PlotPoint,
    x: float,
    sy,
    y_bot: float,
    hi: float,  # type: ignore[no-untyped-def]
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
    elif e.metric > hi:  # clipped outlier: a triangle at the top edge
        y = sy(hi)
        shape = f'<path d="M{x:.1f},{y - 1:.1f}l5,9h-10z"/>'
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
