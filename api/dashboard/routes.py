"""Dashboard routes: HTML pages, two small JSON endpoints for the live panels, downloads.

Thin: parse, ask views.py, render. Pages live under `/ui/...` (the overview also at `/`) so
they never shadow the JSON API's `/sweeps/{name}` and `/experiments/{id}`. Plain `def`
routes: the store is blocking I/O and FastAPI runs them in its thread pool.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from jinja2 import Environment, FileSystemLoader, select_autoescape

from agent.analysis.report import fmt_delta
from agent.analysis.secondary import fmt_secondary
from agent.analysis.words import TERMS, weighed, why_not_kept
from agent.core.domain import utcnow
from agent.core.errors import NotFoundError
from agent.ops.service import holdout_key, read_log
from api.deps import (
    TOKEN_COOKIE,
    LoginRequired,
    PageAuth,
    ReadAuth,
    ReadsDep,
    ServiceDep,
    ServicesDep,
    safe_next,
    token_matches,
)
from api.docs import MAX_ID, ExperimentId

from . import views
from .window import parse_window

logger = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
STATIC = {"dashboard.css": "text/css", "dashboard.js": "text/javascript"}

Reads = ReadsDep

router = APIRouter(include_in_schema=False)
pages = APIRouter(dependencies=[PageAuth], include_in_schema=False)
json = APIRouter(include_in_schema=False)


@lru_cache(maxsize=1)
def templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(metric=_metric, delta=_delta, pct=_pct, secs=_secs, ts=_ts, hours=_hours,
                       num4=fmt_secondary)
    env.globals.update(terms=TERMS, why_not_kept=why_not_kept, weighed=weighed)
    return env


def _metric(v: float | None) -> str:
    return "–" if v is None else f"{v:.6f}"


def _delta(v: float | None) -> str:
    return fmt_delta(v)


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:+.2%}"


def _secs(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}"


def _hours(v: float) -> str:
    return f"{v:.2f}" if v >= 0.1 or v == 0 else f"{v:.3f}"


def _ts(v: Any) -> str:
    return "" if v is None else v.strftime("%Y-%m-%d %H:%M:%S UTC")


def render(name: str, **ctx: Any) -> HTMLResponse:
    return HTMLResponse(templates().get_template(name).render(**ctx))


def _sweep(reads: Reads, name: str) -> Any:
    try:
        return reads.store.get_sweep(name)
    except NotFoundError as exc:
        raise HTTPException(404, str(exc)) from None


def _experiment(reads: Reads, exp_id: int) -> Any:
    try:
        return reads.store.get_experiment(exp_id)
    except NotFoundError as exc:
        raise HTTPException(404, str(exc)) from None


# --- open routes: static files and the token form --------------------------------------------
@router.get("/ui/static/{name}")
def static(name: str) -> Response:
    if name not in STATIC:
        raise HTTPException(404, "no such file")
    return FileResponse(
        HERE / "static" / name, media_type=STATIC[name], headers={"Cache-Control": "max-age=300"}
    )


@router.get("/ui/login", response_class=HTMLResponse)
def login_form(next: str = "/") -> HTMLResponse:
    return render("login.html", next=safe_next(next))


def login_required(_request: Request, exc: Exception) -> HTMLResponse:
    """A page without a valid token: 401 with the login form, which returns to the page."""
    assert isinstance(exc, LoginRequired)
    page = render("login.html", next=safe_next(exc.next_path), error=exc.error)
    page.status_code = 401
    page.headers["WWW-Authenticate"] = "Bearer"
    page.headers["Cache-Control"] = "no-store"
    return page


@router.post("/login")
async def login(request: Request, services: ServicesDep) -> Response:
    """The form's POST: set the `overnight_token` cookie (HttpOnly, SameSite=Strict) and go to
    `next` (a path on this site only). The token travels in the body, never in a URL."""
    body = (await request.body()).decode("utf-8", "replace")
    form = {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}
    target = safe_next(form.get("next"))
    token = form.get("token", "")
    if not token_matches(services.settings, token):
        page = render("login.html", next=target, error="That token is not this server's.")
        page.status_code = 401
        return page
    resp = RedirectResponse(target, status_code=303)
    resp.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict",
                    secure=False, max_age=30 * 24 * 3600)
    return resp


# --- pages ---------------------------------------------------------------------------------
@pages.get("/", response_class=HTMLResponse)
@pages.get("/ui/", response_class=HTMLResponse)
def overview_page(reads: Reads) -> HTMLResponse:
    return render("overview.html", rows=views.overview(reads))


@pages.get("/ui/sweeps/{name}", response_class=HTMLResponse)
def sweep_page(
    service: ServiceDep, reads: Reads, name: str, status: str = "all",
    page: Annotated[int, Query(ge=1, le=1_000_000)] = 1,
    before: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
    after: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None,
    since: Annotated[str | None, Query(max_length=64)] = None,
    until: Annotated[str | None, Query(max_length=64)] = None,
) -> HTMLResponse:
    """The sweep; its table is a keyset page: `before`/`after` an id (the pager's links),
    `since`/`until` a time window on created_at (window.py)."""
    try:
        span = parse_window(since, until, utcnow())
    except ValueError as exc:
        raise HTTPException(422, {"code": "validation", "message": str(exc)}) from None
    sweep = _sweep(reads, name)
    return render("sweep.html", **views.sweep_page(service, reads, sweep, status, page, before,
                                                   after, span))


@json.get("/ui/sweeps/{name}/live")
def sweep_live(reads: Reads, _: ReadAuth, name: str) -> JSONResponse:
    """The sweep's running experiments (log tail, loss curve, elapsed) for the live panel."""
    sweep = _sweep(reads, name)
    from agent.core.domain import ExperimentStatus

    running = reads.store.list_experiments(sweep.id, statuses=[ExperimentStatus.RUNNING])
    done = reads.store.count_experiments(sweep.id)
    return JSONResponse(
        {
            "sweep": sweep.name,
            "status": sweep.status.value,
            "experiments": done,
            "running": [views.live_run(reads, sweep, e) for e in running],
        },
        headers={"Cache-Control": "no-store"},
    )


@pages.get("/ui/sweeps/{name}/best/{path:path}")
def best_download(service: ServiceDep, reads: Reads, name: str, path: str) -> PlainTextResponse:
    text = views.best_file(service, _sweep(reads, name), path)
    if text is None:
        raise HTTPException(404, f"no editable file {path!r} at the best commit")
    return PlainTextResponse(
        text, headers={"Content-Disposition": f'attachment; filename="{Path(path).name}"'}
    )


@pages.get("/ui/sweeps/{name}/report", response_class=HTMLResponse)
def report_page(reads: Reads, name: str) -> HTMLResponse:
    """The morning report: one self-contained page (`overnight report --format html`)."""
    from agent.ops.morning import report_of

    from .report_html import render_html

    sweep = _sweep(reads, name)
    return HTMLResponse(render_html(report_of(reads.store, sweep.name)),
                        headers={"Cache-Control": "no-store"})


@pages.get("/ui/sweeps/{name}/report.md")
def report_markdown(reads: Reads, name: str) -> PlainTextResponse:
    """The same report as Markdown (`overnight report`), to paste into a PR or a chat."""
    from agent.analysis.morning_md import render_markdown
    from agent.ops.morning import report_of

    sweep = _sweep(reads, name)
    return PlainTextResponse(render_markdown(report_of(reads.store, sweep.name)),
                             media_type="text/markdown; charset=utf-8",
                             headers={"Cache-Control": "no-store"})


@pages.get("/ui/experiments/{exp_id}", response_class=HTMLResponse)
def experiment_page(reads: Reads, exp_id: ExperimentId) -> HTMLResponse:
    return render("experiment.html", **views.experiment_page(reads, _experiment(reads, exp_id)))


@json.get("/ui/experiments/{exp_id}/tail")
def experiment_tail(reads: Reads, _: ReadAuth, exp_id: ExperimentId) -> JSONResponse:
    e = _experiment(reads, exp_id)
    return JSONResponse(
        views.live_run(reads, reads.store.get_sweep_by_id(e.sweep_id), e),
        headers={"Cache-Control": "no-store"},
    )


@pages.get("/ui/experiments/{exp_id}/log.txt")
def experiment_log(reads: Reads, exp_id: ExperimentId) -> Response:
    e = _experiment(reads, exp_id)
    headers = {"Content-Disposition": f'attachment; filename="experiment-{e.id}.log"'}
    sealed = holdout_key(reads.store, e)
    if e.log_path and Path(e.log_path).is_file() and not sealed:
        return FileResponse(e.log_path, media_type="text/plain; charset=utf-8", headers=headers)
    if sealed and e.log_path and Path(e.log_path).is_file():  # the holdout's line sealed
        return PlainTextResponse(read_log(e, sealed=sealed), headers=headers)
    if e.log_tail:  # the tail stored at finish (after a line saying so once gc pruned the log)
        return PlainTextResponse(read_log(e), headers=headers)
    raise HTTPException(404, "this experiment has no log")


router.include_router(pages)
router.include_router(json)


def install(app: FastAPI) -> None:
    """Add the dashboard to `app`: its routes, and the login form as the answer to a page
    asked for without the token."""
    app.include_router(router)
    app.add_exception_handler(LoginRequired, login_required)
