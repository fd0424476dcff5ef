"""JSON error bodies `{"detail": {"code", "message"}}` for every refusal; the body-size limit."""

from __future__ import annotations

import html
import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent.core.errors import (
    AdmissionError,
    ConfigError,
    ConflictError,
    NotFoundError,
    StoreError,
    is_out_of_space,
)
from agent.git.repo import GitError

logger = logging.getLogger(__name__)


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"detail": {"code": code, "message": message, **extra}}


def _json(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse(error_body(code, message, **extra), status_code=status)


def _validation_message(errors: list[dict[str, Any]]) -> str:
    parts = []
    for e in errors[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


# Errors whose message is the whole story: exception type -> (HTTP status, code).
_PLAIN_ERRORS: dict[type[Exception], tuple[int, str]] = {
    NotFoundError: (404, "not_found"),
    ConflictError: (409, "conflict"),
    ConfigError: (422, "invalid"),
    GitError: (422, "git"),
}


def _plain_handler(status: int, code: str) -> Any:
    def handle(request: Request, exc: Exception) -> JSONResponse:
        if is_out_of_space(exc):  # git could not write: no fault of the request
            return _no_space(request, exc)
        return _json(status, code, str(exc))

    return handle


def _no_space(request: Request, exc: Exception) -> JSONResponse:
    """503 for a write that failed for lack of space; /health says so too (the engine's
    DiskSpaceWatch, which also probes for the space coming back)."""
    services = getattr(request.app.state, "services", None)
    if services is not None:
        services.runtime.disk_space.note_failure(exc, f"{request.method} {request.url.path}")
    return _json(503, "no_space", f"{exc}; nothing was changed: try again once space is freed "
                 "(the service goes on by itself)")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(AdmissionError)
    def _admission(_r: Request, exc: AdmissionError) -> JSONResponse:
        return _json(exc.status_hint, exc.code, exc.message)

    for exc_type, (status, code) in _PLAIN_ERRORS.items():
        app.add_exception_handler(exc_type, _plain_handler(status, code))

    @app.exception_handler(StoreError)
    def _store(request: Request, exc: StoreError) -> JSONResponse:
        logger.error("store error: %s", exc)
        if exc.out_of_space:
            return _no_space(request, exc)
        return _json(503, "database", str(exc))

    @app.exception_handler(RequestValidationError)
    def _validation(_r: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")}
                  for e in exc.errors()]
        code = "malformed_json" if any(e.get("type") == "json_invalid" for e in errors) \
            else "validation"
        return _json(422, code, _validation_message(errors), errors=errors)

    @app.exception_handler(StarletteHTTPException)
    def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
            # FastAPI answers 400 for a JSON body that is not UTF-8; it is invalid input (422)
            return _json(422, "malformed_json", f"the body is not valid UTF-8: {exc.__cause__}")
        if exc.status_code == 404 and _wants_page(request):
            return HTMLResponse(_not_found_page(str(exc.detail)), status_code=404)
        if isinstance(exc.detail, dict) and "code" in exc.detail:
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code,
                                headers=exc.headers)
        code = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.status_code, "http_error")
        headers = exc.headers
        if exc.status_code == 405:  # Starlette names only the first matching route's methods
            headers = {**(headers or {}), "Allow": ", ".join(_allowed_methods(request))}
        return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code,
                            headers=headers)


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route answers on this path."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def _wants_page(request: Request) -> bool:
    """A browser on a dashboard address gets a page; API clients keep JSON errors."""
    path = request.url.path
    return (path == "/" or path.startswith("/ui/")) and "text/html" in request.headers.get(
        "accept", "")


def _not_found_page(detail: str) -> str:
    return ("<!doctype html><html><head><meta charset='utf-8'><title>not found · overnight"
            "</title></head><body style='font-family:sans-serif;margin:3em'><h1>Not found</h1>"
            f"<p>{html.escape(detail)}</p><p><a href='/'>all sweeps</a></p></body></html>")


class BodyLimitMiddleware:
    """Refuse request bodies over `max_bytes` with 413, before the route reads them.

    Checks Content-Length up front and counts streamed (chunked) bodies as they arrive.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._reject(send)
            return
        seen = 0
        too_large = False
        rejected = False

        async def limited() -> Message:
            nonlocal seen, too_large
            if too_large:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:  # stop reading; the app's answer is replaced below
                    too_large = True
                    return {"type": "http.request", "body": b"", "more_body": False}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal rejected
            if too_large:
                if not rejected:
                    rejected = True
                    await self._reject(send)
                return
            await send(message)

        await self.app(scope, limited, guarded_send)

    async def _reject(self, send: Send) -> None:
        body = json.dumps(error_body("too_large", f"request body is larger than "
                                     f"{self.max_bytes} bytes")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
