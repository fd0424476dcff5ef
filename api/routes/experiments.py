"""Experiment routes: queue, list (filters, cursor), read, diff, log (SSE follow), cancel."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Annotated

import anyio
from fastapi import APIRouter, Query, Response, status
from fastapi.responses import PlainTextResponse, StreamingResponse

from agent.analysis.secondary import SecondaryMean, secondary_means
from agent.core.domain import CrashKind, Experiment, ExperimentStatus, Proposal
from agent.ops.service import holdout_key, read_log
from agent.rules.holdout import redact
from api.deps import ReadAuth, Services, ServicesDep, WriteAuth
from api.docs import (
    COMMON,
    READ,
    WRITE,
    Cursor,
    ExperimentId,
    Since,
    Until,
    errors,
    text_body,
    time_window,
)
from api.schemas import MAX_LIMIT, CancelPublic, ExperimentCreate, ExperimentPublic, Page

router = APIRouter(prefix="/experiments", tags=["experiments"], responses=COMMON)
FOLLOW_POLL_S = 0.25
STATUS_POLL_S = 1.0
FOLLOW_MAX_S = 6 * 3600.0
FOLLOW_CHUNK = 256 * 1024  # bytes read per poll: a flood cannot hold the event loop
# One server-sent event (OpenAPI 3.1: the stream's schema describes each event): a log line
# (no event name), `status` first, `end` last; data of status/end is JSON.
SSE_EVENT = {"type": "object", "required": ["data"], "properties": {
    "event": {"type": "string", "enum": ["status", "end"]}, "data": {"type": "string"}}}


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ExperimentPublic,
             responses={**WRITE, **errors(404, 409)})
async def queue(body: ExperimentCreate, services: ServicesDep,
                _auth: WriteAuth) -> ExperimentPublic:
    """Admit and queue one proposal; a refusal queues nothing and says why (409/413/422)."""
    proposal = Proposal(description=body.description, diff=body.diff, proposer="external")
    # Blocking work (database, git) in the admissions' own worker threads, per-sweep bounded.
    exp = await services.admissions.run(body.sweep, partial(
        services.service.queue, body.sweep, proposal, priority=body.priority))
    return ExperimentPublic.of(exp, body.sweep)  # queued: no run, no `secondary` read


@router.get("", response_model=Page[ExperimentPublic], responses={**READ, **errors(404)})
def list_experiments(
    services: ServicesDep, _auth: ReadAuth,
    sweep: Annotated[str | None, Query(description="sweep name")] = None,
    status_: Annotated[list[ExperimentStatus] | None, Query(alias="status",
                       description="one or more statuses (repeat the parameter)")] = None,
    crash_kind: Annotated[CrashKind | None, Query()] = None,
    since: Since = None,
    until: Until = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
    cursor: Cursor = None,
) -> Page[ExperimentPublic]:
    """Newest first, `limit` per page; follow `next_cursor` for older ones. With `since` or
    `until` the page is of experiments created in [since, until), and `count` is null (the
    maintained counts are per sweep, status and crash kind, not per time)."""
    since, until = time_window(since, until)
    store = services.store
    with store.reading():  # one connection and one transaction for the page and its count
        one = store.get_sweep(sweep) if sweep else None
        sweep_id = one.id if one else None
        rows = store.list_experiments(sweep_id, status_, limit=limit, newest_first=True,
                                      before_id=cursor, crash_kind=crash_kind,
                                      since=since, until=until)
        # The names and secondary keys of the page's sweeps only (a year of nights is hundreds
        # of sweeps); a row's runs only when its sweep names keys.
        heads = {one.id: (one.name, one.config.secondary)} if one else \
            services.reads.sweep_heads({e.sweep_id for e in rows})
        names = {i: name for i, (name, _) in heads.items()}
        secondary = page_secondary(services, rows, {i: keys for i, (_, keys) in heads.items()})
        total = None if since or until else store.count_experiments(
            sweep_id, status_, crash_kind)
    nxt = rows[-1].id if len(rows) == limit and rows[-1].id > 1 else None
    return Page(data=[ExperimentPublic.of(e, names.get(e.sweep_id, "?"),
                                          secondary=secondary.get(e.id)) for e in rows],
                count=total, next_cursor=nxt)


def page_secondary(services: Services, rows: list[Experiment],
                   keys_of: dict[int, tuple[str, ...]]) -> dict[int, tuple[SecondaryMean, ...]]:
    """Each row's `[target] secondary` keys' means over the runs its value rests on
    (agent.analysis.secondary), by id; a row's runs are read only when its sweep names keys."""
    out = {}
    for e in rows:
        keys = keys_of.get(e.sweep_id, ())
        if keys:
            runs = services.store.list_runs(experiment_id=e.id)
            out[e.id] = secondary_means(e.record, runs, keys)
    return out


@router.get("/{experiment_id}", response_model=ExperimentPublic,
            responses={**READ, **errors(404)})
def get_experiment(experiment_id: ExperimentId, services: ServicesDep,
                   _auth: ReadAuth) -> ExperimentPublic:
    with services.store.reading():
        exp = services.store.get_experiment(experiment_id)
        sweep = services.store.get_sweep_by_id(exp.sweep_id)
        runs = services.store.list_runs(experiment_id=experiment_id)
    return ExperimentPublic.of(exp, sweep.name, with_diff=True, runs=runs,
                               keys=sweep.config.secondary)


@router.get("/{experiment_id}/diff", response_class=PlainTextResponse,
            responses={**text_body("text/x-diff", "the unified diff"), **READ, **errors(404)})
def get_diff(experiment_id: ExperimentId, services: ServicesDep,
             _auth: ReadAuth) -> PlainTextResponse:
    exp = services.store.get_experiment(experiment_id)
    return PlainTextResponse(exp.diff, media_type="text/x-diff; charset=utf-8")


@router.delete("/{experiment_id}", response_model=CancelPublic,
               responses={202: {"model": CancelPublic, "description": "a running experiment "
                                "is being stopped"}, **errors(401, 404, 409)})
def cancel(experiment_id: ExperimentId, services: ServicesDep, _auth: WriteAuth,
           response: Response) -> CancelPublic:
    """Cancel a queued experiment, or stop a running one (recorded `cancelled`); 409 if finished.

    202 while a running experiment is being stopped."""
    exp, pending = services.service.cancel(experiment_id)
    if pending:
        response.status_code = status.HTTP_202_ACCEPTED
    sweep = services.store.get_sweep_by_id(exp.sweep_id)
    keys = sweep.config.secondary
    runs = services.store.list_runs(experiment_id=exp.id) if keys else None
    return CancelPublic(experiment=ExperimentPublic.of(
        exp, sweep.name, secondary=None if runs is None else secondary_means(
            exp.record, runs, keys)), pending=pending)


def _sse(event: str | None, data: str) -> str:
    head = f"event: {event}\n" if event else ""
    return head + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


async def follow_log(services: Services, experiment_id: int) -> AsyncIterator[str]:
    """Server-sent events: each log line as `data`, then `event: end` with the final status.

    Async: a follower holds no worker thread, only a timer. While the log is silent a comment
    line goes out every `sse_heartbeat_s`, so a follower whose client has gone is noticed
    (the write fails) and closed.
    """
    exp = await anyio.to_thread.run_sync(services.store.get_experiment, experiment_id)
    sealed = await anyio.to_thread.run_sync(holdout_key, services.store, exp)
    services.followers += 1
    try:
        yield _sse("status", json.dumps({"id": exp.id, "status": exp.status.value}))
        async for event in _follow(services, exp, sealed):
            yield event
    finally:
        services.followers -= 1


async def _follow(services: Services, exp: Experiment, sealed: str | None = None
                  ) -> AsyncIterator[str]:
    offset, partial = 0, b""
    heartbeat_s = services.settings.sse_heartbeat_s
    started = last_status = last_sent = time.monotonic()
    while True:
        chunk = _read_from(exp.log_path, offset)
        offset += len(chunk)
        lines = (partial + chunk).split(b"\n")
        partial = lines.pop()
        for line in lines:
            yield _sse(None, redact(line.decode("utf-8", "replace").rstrip("\r"), sealed))
        if lines:
            last_sent = time.monotonic()
        if len(chunk) == FOLLOW_CHUNK:
            await anyio.sleep(0)  # let others run between chunks of a flood
            continue
        if exp.status.is_finished():
            if partial:
                yield _sse(None, redact(partial.decode("utf-8", "replace"), sealed))
            yield _sse("end", json.dumps({"id": exp.id, "status": exp.status.value,
                                          "metric": exp.metric}))
            return
        if time.monotonic() - started > FOLLOW_MAX_S:
            yield _sse("end", json.dumps({"id": exp.id, "status": exp.status.value,
                                          "timeout": True}))
            return
        if time.monotonic() - last_sent >= heartbeat_s:
            yield ": heartbeat\n\n"
            last_sent = time.monotonic()
        await anyio.sleep(FOLLOW_POLL_S)
        if time.monotonic() - last_status >= STATUS_POLL_S or exp.log_path is None:
            exp = await anyio.to_thread.run_sync(services.store.get_experiment, exp.id)
            last_status = time.monotonic()


def _read_from(log_path: str | None, offset: int) -> bytes:
    """Up to FOLLOW_CHUNK bytes of the log from `offset` (b"" while there is no log yet)."""
    if not log_path:
        return b""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            return fh.read(FOLLOW_CHUNK)
    except OSError:
        return b""


@router.get("/{experiment_id}/log", response_model=None,
            responses={200: {"description": "the log (text/plain), or with ?follow=1 a stream "
                             "of server-sent events",
                             "content": {"text/plain": {"schema": {"type": "string"}},
                                         "text/event-stream": {"schema": SSE_EVENT}}},
                       **READ, **errors(404)})
def get_log(experiment_id: ExperimentId, services: ServicesDep, _auth: ReadAuth,
            follow: Annotated[bool, Query(description="stream as server-sent events until "
                                          "the run ends")] = False,
            ) -> PlainTextResponse | StreamingResponse:
    """The run's log; with `?follow=1` a text/event-stream of its lines until it finishes."""
    exp = services.store.get_experiment(experiment_id)
    if not follow:
        return PlainTextResponse(read_log(exp, sealed=holdout_key(services.store, exp)))
    return StreamingResponse(follow_log(services, experiment_id), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
