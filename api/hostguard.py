"""Refuse requests whose Host header names a host this server was not bound as (DNS rebinding).

A page on evil.example whose name is re-pointed at 127.0.0.1 reaches a loopback server from
the victim's browser, with `Host: evil.example`. Answering only to the names the server is
known by (loopback names, the bound address, the machine's own names, any configured extra)
turns that into a 400 before any route runs.
"""

from __future__ import annotations

import json
import socket

from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_HOST_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("0.0.0.0", "::", "")


def host_name(header: str) -> str:
    """The name part of a Host header: `[::1]:8000` -> `::1`, `Example.org:80` -> `example.org`."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def trusted_hosts(bound: str, extra: tuple[str, ...] = ()) -> frozenset[str] | None:
    """The Host names to answer to; None when `extra` holds "*" (answer to any name)."""
    if "*" in extra:
        return None
    names = {*LOOPBACK_HOST_NAMES, *(host_name(h) for h in extra)}
    bound = bound.strip("[]").lower()
    if bound in WILDCARD_BINDS:  # reachable by the machine's own names
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    else:
        names.add(bound)
    return frozenset(n for n in names if n)


class TrustedHostMiddleware:
    """400 with a JSON error naming the host and the fix, unless the Host header is trusted."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str] | None) -> None:
        self.app, self.allowed = app, allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allowed is None:
            await self.app(scope, receive, send)
            return
        raw = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
        if host_name(raw) in self.allowed:
            await self.app(scope, receive, send)
            return
        message = (f"this server does not answer to host {raw!r} (DNS rebinding guard); "
                   "start it with --allowed-host NAME to accept that name")
        body = json.dumps({"detail": {"code": "bad_host", "message": message}}).encode()
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
