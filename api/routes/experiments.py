"""Experiment routes: queue, list (filters, cursor), read, diff, log (SSE follow), cancel."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from fastapi.responses import PlainTextResponse, StreamingResponse

from agent.domain import CrashKind, ExperimentStatus, Proposal
from agent.service import read_log
from api.deps import ReadAuth, Services, ServicesDep, WriteAuth
from api.schemas import MAX_LIMIT, CancelPublic, ExperimentCreate, ExperimentPublic, Page

router = APIRouter(prefix="/experiments", tags=["experiments"])
FOLLOW_POLL_S = 0.25
STATUS_POLL_S = 1.0
FOLLOW_MAX_S = 6 * 3600.0


def _sweep_names(services: Services) -> dict[int, str]:
    return {s.id: s.name for s in services.store.list_sweeps()}


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ExperimentPublic)
def queue(body: ExperimentCreate, services: ServicesDep, _auth: WriteAuth) -> ExperimentPublic:
    """Admit and queue one proposal; a refusal queues nothing and says why (409/413/422)."""
    proposal = Proposal(description=body.description, diff=body.diff, proposer="external")
    exp = services.service.queue(body.sweep, proposal, priority=body.priority)
    return ExperimentPublic.of(exp, body.sweep)


@router.get("", response_model=Page[ExperimentPublic])
def list_experiments(
    services: ServicesDep, _auth: ReadAuth,
    sweep: Annotated[str | None, Query(description="sweep name")] = None,
    status_: Annotated[list[ExperimentStatus] | None, Query(alias="status",
                       description="one or more statuses (repeat the parameter)")] = None,
    crash_kind: Annotated[CrashKind | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
    cursor: Annotated[int | None, Query(ge=1, description="next_cursor of the page before")]
    = None,
) -> Page[ExperimentPublic]:
    """Newest first, `limit` per page; follow `next_cursor` for older ones."""
    names = _sweep_names(services)
    sweep_id = services.store.get_sweep(sweep).id if sweep else None
    rows = services.store.list_experiments(sweep_id, status_, limit=limit, newest_first=True,
                                           before_id=cursor, crash_kind=crash_kind)
    total = services.store.count_experiments(sweep_id, status_, crash_kind)
    nxt = rows[-1].id if len(rows) == limit and rows[-1].id > 1 else None
    return Page(data=[ExperimentPublic.of(e, names.get(e.sweep_id, "?")) for e in rows],
                count=total, next_cursor=nxt)


@router.get("/{experiment_id}", response_model=ExperimentPublic)
def get_experiment(experiment_id: int, services: ServicesDep, _auth: ReadAuth) -> ExperimentPublic:
    exp = services.store.get_experiment(experiment_id)
    sweep = services.store.get_sweep_by_id(exp.sweep_id)
    return ExperimentPublic.of(exp, sweep.name, with_diff=True)


@router.get("/{experiment_id}/diff", response_class=PlainTextResponse)
def get_diff(experiment_id: int, services: ServicesDep, _auth: ReadAuth) -> PlainTextResponse:
    exp = services.store.get_experiment(experiment_id)
    return PlainTextResponse(exp.diff, media_type="text/x-diff; charset=utf-8")


@router.delete("/{experiment_id}", response_model=CancelPublic)
def cancel(experiment_id: int, services: ServicesDep, _auth: WriteAuth,
           response: Response) -> CancelPublic:
    """Cancel a queued experiment, or stop a running one (recorded `cancelled`); 409 if finished.

    202 while a running experiment is being stopped."""
    exp, pending = services.service.cancel(experiment_id)
    if pending:
        response.status_code = status.HTTP_202_ACCEPTED
    sweep = services.store.get_sweep_by_id(exp.sweep_id)
    return CancelPublic(experiment=ExperimentPublic.of(exp, sweep.name), pending=pending)


def _sse(event: str | None, data: str) -> str:
    head = f"event: {event}\n" if event else ""
    return head + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


def follow_log(services: Services, experiment_id: int) -> Iterator[str]:
    """Server-sent events: each log line as `data`, then `event: end` with the final status."""
    store = services.store
    exp = store.get_experiment(experiment_id)
    offset, partial = 0, b""
    started = last_status = time.monotonic()
    yield _sse("status", json.dumps({"id": exp.id, "status": exp.status.value}))
    while True:
        path = Path(exp.log_path) if exp.log_path else None
        if path is not None and path.is_file():
            with open(path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read(1024 * 1024)
            offset += len(chunk)
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()
            for line in lines:
                yield _sse(None, line.decode("utf-8", "replace").rstrip("\r"))
            if len(chunk) == 1024 * 1024:
                continue
        if exp.status.is_finished():
            if partial:
                yield _sse(None, partial.decode("utf-8", "replace"))
            yield _sse("end", json.dumps({"id": exp.id, "status": exp.status.value,
                                          "metric": exp.metric}))
            return
        if time.monotonic() - started > FOLLOW_MAX_S:
            yield _sse("end", json.dumps({"id": exp.id, "status": exp.status.value,
                                          "timeout": True}))
            return
        time.sleep(FOLLOW_POLL_S)
        if time.monotonic() - last_status >= STATUS_POLL_S or exp.log_path is None:
            exp, last_status = store.get_experiment(experiment_id), time.monotonic()
            if exp.status.is_finished():
                continue  # one more read of the file picks up its last lines


@router.get("/{experiment_id}/log", response_model=None,
            responses={200: {"content": {"text/plain": {}, "text/event-stream": {}}}})
def get_log(experiment_id: int, services: ServicesDep, _auth: ReadAuth,
            follow: Annotated[bool, Query(description="stream as server-sent events until "
                                          "the run ends")] = False,
            ) -> PlainTextResponse | StreamingResponse:
    """The run's log; with `?follow=1` a text/event-stream of its lines until it finishes."""
    exp = services.store.get_experiment(experiment_id)
    if not follow:
        return PlainTextResponse(read_log(exp))
    return StreamingResponse(follow_log(services, experiment_id), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
