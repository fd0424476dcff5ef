"""What the OpenAPI document promises: the error body, route error statuses, id bounds, time filter.

Every refusal is `{"detail": {"code", "message"}}` (api.errors); listing it per route lets a
client (and schemathesis' conformance checks) know every status and body it can get.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

from fastapi import FastAPI, Path, Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, BeforeValidator, ConfigDict

from agent.core.domain import as_utc

MAX_ID = 2**63 - 1  # SQLite's INTEGER: a larger id can name nothing (it overflowed before)

_WHY = {
    400: "the Host header is not one this server answers to (DNS rebinding guard)",
    401: "missing or invalid bearer token",
    404: "no such sweep or experiment",
    409: "clashes with current state (finished record, diff that no longer applies, name taken)",
    413: "request body over the size limit",
    422: "invalid input: the message names the field",
    503: "the database failed",
}


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")  # validation errors add `errors`

    code: str
    message: str


class ErrorPublic(BaseModel):
    detail: ErrorDetail


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: each status with the shared error body."""
    return {s: {"model": ErrorPublic, "description": _WHY[s]} for s in statuses}


def text_body(media_type: str, description: str) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a 200 that is text, not JSON."""
    return {200: {"description": description,
                  "content": {media_type: {"schema": {"type": "string"}}}}}


def errors_are_json(document: dict[str, Any]) -> dict[str, Any]:
    """FastAPI files a route's error responses under the route's own media type (text/plain for
    a text route); every error body is JSON, so say so."""
    ref = {"$ref": "#/components/schemas/ErrorPublic"}
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                if status[:1] in ("4", "5"):
                    response["content"] = {"application/json": {"schema": ref}}
    return document


def install_openapi(app: FastAPI) -> None:
    """Serve the corrected document at /openapi.json (built once, on first request)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = errors_are_json(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


# Answered by every route: the host guard, validation, the database.
COMMON = errors(400, 422, 503)
READ = errors(401)  # reads need the token too (unless the server opened them)
WRITE = errors(401, 413)

ExperimentId = Annotated[int, Path(ge=1, le=MAX_ID, description="experiment id")]
Cursor = Annotated[int | None, Query(ge=1, le=MAX_ID,
                                     description="next_cursor of the page before")]
# The time filter: experiments created in [since, until) (db/keyset.py says why created_at).
_WHEN = ("ISO 8601 date or date-time; with an offset or `Z`, else read as UTC. Filters on "
         "created_at, the time the experiment was queued (or refused)")


def _not_a_number(value: object) -> object:
    """pydantic reads a bare number as Unix seconds; the documented format is ISO 8601 only."""
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        raise ValueError("expected an ISO 8601 date or date-time, not a number")
    return value


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
Since = Annotated[datetime | None, BeforeValidator(_not_a_number),
                  Query(description=f"created at or after this. {_WHEN}")]
Until = Annotated[datetime | None, BeforeValidator(_not_a_number),
                  Query(description=f"created before this. {_WHEN}")]


def time_window(since: datetime | None,
                until: datetime | None) -> tuple[datetime | None, datetime | None]:
    """`since` and `until` as aware UTC; 422 naming `until` when it is not after `since`."""
    since = as_utc(since) if since is not None else None
    until = as_utc(until) if until is not None else None
    if since is not None and until is not None and until <= since:
        raise RequestValidationError([{
            "loc": ("query", "until"), "type": "value_error",
            "msg": f"until ({until.isoformat()}) must be after since ({since.isoformat()})"}])
    return since, until
