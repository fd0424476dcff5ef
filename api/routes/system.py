"""Service routes: health and Prometheus-style counters (the login form is the dashboard's)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse, RedirectResponse

from agent.core.domain import ExperimentStatus
from api.deps import ReadAuth, ServicesDep, safe_next
from api.docs import COMMON, READ, text_body
from api.schemas import HealthPublic

router = APIRouter(tags=["service"], responses=COMMON)


@router.get("/health", response_model=HealthPublic)
def health(services: ServicesDep) -> HealthPublic:
    """Scheduler alive, slots busy, queue depth, database reachable and writing. Needs no
    token."""
    try:
        services.store.ping()
        db = "ok"
    except Exception as exc:  # the point of the route is to say so, not to fail
        db = f"error: {exc.__class__.__name__}"
    disk_space = services.runtime.disk_space
    disk_space.probe_when_due()  # while failing, a probe when due: current even with no engine
    failing = disk_space.failing
    if db == "ok" and failing is not None:
        db = f"writes fail for lack of space: {failing.reason}"
    sched = services.scheduler
    state = "disabled" if sched is None else ("running" if sched.alive else "stopped")
    queued = services.store.count_experiments(statuses=[ExperimentStatus.QUEUED]) \
        if not db.startswith("error") else -1
    retired = dict(sched.retired) if sched else {}
    ok = db == "ok" and state != "stopped" and not retired
    return HealthPublic(status="ok" if ok else "degraded", db=db, scheduler=state,
                        slots=services.settings.slots if sched else 0,
                        busy=sched.busy() if sched else 0,
                        running=sched.running_ids() if sched else [], queue_depth=queued,
                        retired_slots=retired,
                        writes_failing_since=failing.since if failing else None)


@router.get("/metrics", response_class=PlainTextResponse,
            responses={**text_body("text/plain", "Prometheus text format"), **READ})
def metrics(services: ServicesDep, _auth: ReadAuth) -> PlainTextResponse:
    """Counters in the Prometheus text format."""
    counts = services.reads.status_counts()
    sched = services.scheduler
    lines = ["# TYPE overnight_experiments gauge"]
    lines += [f'overnight_experiments{{status="{s.value}"}} {counts.get(s.value, 0)}'
              for s in ExperimentStatus]
    gauges = {"overnight_slots": services.settings.slots if sched else 0,
              "overnight_slots_busy": sched.busy() if sched else 0,
              "overnight_sweeps": len(services.store.list_sweeps()),
              "overnight_log_followers": services.followers}
    for name, value in gauges.items():
        lines += [f"# TYPE {name} gauge", f"{name} {value}"]
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


@router.get("/login", include_in_schema=False)
def login_moved(next: Annotated[str, Query()] = "/") -> RedirectResponse:
    """Old links: the token is never taken from a URL (it would land in access logs and
    browser history); send the browser to the form, which POSTs it."""
    return RedirectResponse(f"/ui/login?next={quote(safe_next(next), safe='/')}",
                            status_code=303)
