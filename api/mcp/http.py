"""MCP streamable HTTP on the service: the same agent tools as `overnight mcp`, under /mcp.

Same bearer token as the API's mutating routes (MCP can queue code to run), also when reads
are open. Stateless mode: every request stands alone, so a restart or several clients need no
session bookkeeping.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from fastapi import FastAPI
from mcp.server.transport_security import TransportSecuritySettings
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from api.deps import TOKEN_HINT, Services, token_matches
from api.mcp.server import build_server
from api.mcp.tools import AgentTools
from api.settings import is_loopback

logger = logging.getLogger(__name__)
MCP_PATH = "/mcp"
_LOCAL_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
_LOCAL_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]


class BearerAuth:
    """ASGI guard: 401 unless `Authorization: Bearer <token>` matches (when auth is on)."""

    def __init__(self, app: ASGIApp, services: Services) -> None:
        self.app, self.services = app, services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        settings = self.services.settings
        if scope["type"] == "http" and settings.auth:
            header = dict(scope.get("headers") or []).get(b"authorization", b"").decode()
            scheme, _, value = header.partition(" ")
            given = value.strip() if scheme.lower() == "bearer" else None
            if not token_matches(settings, given):
                message = ("invalid token" if given else "MCP over HTTP needs 'Authorization: "
                           f"Bearer <token>'; {TOKEN_HINT}")
                response = JSONResponse({"detail": {"code": "unauthorized", "message": message}},
                                        status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def mount_mcp(app: FastAPI, services: Services) -> contextlib.AbstractAsyncContextManager[Any]:
    """Add /mcp to `app`; returns the context manager create_app enters for the app's life."""
    host = services.settings.host
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=is_loopback(host),
        allowed_hosts=_LOCAL_HOSTS, allowed_origins=_LOCAL_ORIGINS)
    tools = AgentTools(services.service)
    server = build_server(tools, stateless_http=True, transport_security=security,
                          log_level="WARNING")
    server.streamable_http_app()  # creates the session manager the route hands requests to
    manager = server.session_manager

    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        await manager.handle_request(scope, receive, send)

    handler = BearerAuth(handle, services)
    for path in (MCP_PATH, MCP_PATH + "/"):
        app.router.routes.append(Route(path, endpoint=handler, include_in_schema=False))
    logger.info("MCP streamable HTTP mounted at %s", MCP_PATH)
    return server.session_manager.run()
