"""The morning report as one self-contained HTML page: the dashboard's stylesheet and the
progress plot (api.dashboard.plot's SVG) inlined, no script, no link to anything outside the
page, so the file opens anywhere (a mail, an artefact store, an offline laptop).

Renders agent.analysis.morning's Report, the model `overnight report --format md` writes
as Markdown. Pure apart from reading this package's template and stylesheet.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from agent.analysis.morning import Report
from agent.analysis.morning_md import (
    VERDICT_WORDS,
    counts_line,
    headline_gain,
    hours,
    metric,
    pm,
    relative,
    set_aside,
    signed,
    span,
)
from agent.analysis.words import REPORT_TERMS, TERMS

from .plot import draw_progress
from .plot_data import PlotFold

HERE = Path(__file__).resolve().parent


@lru_cache(maxsize=1)
def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"),
                      autoescape=select_autoescape(["html"]), trim_blocks=True,
                      lstrip_blocks=True)
    env.filters.update(metric=metric, signed=signed, hours=hours, code=code_spans)
    env.globals.update(pm=pm, counts_line=counts_line, span=span, set_aside=set_aside,
                       rel=relative, verdict_words=VERDICT_WORDS, headline_gain=headline_gain,
                       terms=TERMS, report_terms=REPORT_TERMS)
    return env


def code_spans(text: str) -> Markup:
    """Markdown's `code` spans of a line as <code>, the rest escaped."""
    parts = str(text).split("`")
    return Markup("").join(Markup("<code>{}</code>").format(p) if i % 2 else p
                           for i, p in enumerate(parts)) if len(parts) % 2 else Markup(
        "{}").format(text)


@lru_cache(maxsize=1)
def stylesheet() -> Markup:
    """The dashboard's CSS, to inline (it names no font or image outside itself)."""
    return Markup((HERE / "static" / "dashboard.css").read_text(encoding="utf-8"))


def progress_svg(report: Report) -> Markup:
    """The dashboard's progress plot of the report's runs; each mark links inside the page."""
    fold = PlotFold()
    for e in report.experiments:
        fold.add(e)
    return draw_progress(fold, report.headline.metric, href="#exp-{id}", evidence=report.evidence,
                         best=report.headline.best)


def render_html(report: Report) -> str:
    return _env().get_template("report.html").render(
        r=report, h=report.headline, a=report.attribution, css=stylesheet(),
        plot=progress_svg(report))
