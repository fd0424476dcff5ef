"""Service routes: health, Prometheus-style counters, and the dashboard's login cookie."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import PlainTextResponse, RedirectResponse

from agent.domain import ExperimentStatus
from api.deps import TOKEN_COOKIE, ReadAuth, ServicesDep, token_matches
from api.schemas import HealthPublic

router = APIRouter(tags=["service"])


@router.get("/health", response_model=HealthPublic)
def health(services: ServicesDep) -> HealthPublic:
    """Scheduler alive, slots busy, queue depth, database reachable. Needs no token."""
    try:
        services.store.ping()
        db = "ok"
    except Exception as exc:  # the point of the route is to say so, not to fail
        db = f"error: {exc.__class__.__name__}"
    sched = services.scheduler
    state = "disabled" if sched is None else ("running" if sched.alive else "stopped")
    queued = services.store.count_experiments(statuses=[ExperimentStatus.QUEUED]) if db == "ok" \
        else -1
    retired = dict(sched.retired) if sched else {}
    ok = db == "ok" and state != "stopped" and not retired
    return HealthPublic(status="ok" if ok else "degraded", db=db, scheduler=state,
                        slots=services.settings.slots if sched else 0,
                        busy=sched.busy() if sched else 0,
                        running=sched.running_ids() if sched else [], queue_depth=queued,
                        retired_slots=retired)


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(services: ServicesDep, _auth: ReadAuth) -> PlainTextResponse:
    """Counters in the Prometheus text format."""
    counts = services.store.status_counts()
    sched = services.scheduler
    lines = ["# TYPE overnight_experiments gauge"]
    lines += [f'overnight_experiments{{status="{s.value}"}} {counts.get(s.value, 0)}'
              for s in ExperimentStatus]
    gauges = {"overnight_slots": services.settings.slots if sched else 0,
              "overnight_slots_busy": sched.busy() if sched else 0,
              "overnight_sweeps": len(services.store.list_sweeps())}
    for name, value in gauges.items():
        lines += [f"# TYPE {name} gauge", f"{name} {value}"]
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


@router.get("/login", include_in_schema=False)
def login(services: ServicesDep, token: Annotated[str, Query()],
          next: Annotated[str, Query()] = "/") -> RedirectResponse:
    """Set the `overnight_token` cookie (HttpOnly, SameSite=Strict) for the dashboard."""
    if not token_matches(services.settings, token):
        raise HTTPException(401, detail={"code": "unauthorized", "message": "invalid token"})
    target = next if next.startswith("/") and not next.startswith("//") else "/"
    resp = RedirectResponse(target, status_code=303)
    resp.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict",
                    secure=False, max_age=30 * 24 * 3600)
    return resp
