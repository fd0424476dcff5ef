"""The dashboard's auth and services, on top of api.deps.

A page asked for without a valid token answers 401 with the login form in place (its `next`
is the page), instead of the API's JSON 401; the JSON endpoints the pages poll use the API's
ReadAuth unchanged.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from agent.ops.service import Service
from api.deps import TOKEN_COOKIE, ReadAuth, ServicesDep, require_read
from db.reads import Reads

COOKIE_NAME = TOKEN_COOKIE


class LoginRequired(Exception):
    """A page asked for without a valid token; answered with the login form (routes.py)."""

    def __init__(self, next_path: str, error: str | None = None) -> None:
        super().__init__(next_path)
        self.next_path, self.error = next_path, error


def page_auth(request: Request, services: ServicesDep) -> None:
    try:
        require_read(request, services)
    except HTTPException as exc:
        if exc.status_code != 401:
            raise
        stale = TOKEN_COOKIE in request.cookies or "authorization" in request.headers
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(target, "That token is not this server's." if stale else None) \
            from None


def _reads(services: ServicesDep) -> Reads:
    return services.reads


def _service(services: ServicesDep) -> Service:
    return services.service


ReadsDep = Annotated[Reads, Depends(_reads)]
ServiceDep = Annotated[Service, Depends(_service)]
PageAuth = Depends(page_auth)
__all__ = ["COOKIE_NAME", "LoginRequired", "PageAuth", "ReadAuth", "ReadsDep", "ServiceDep"]
