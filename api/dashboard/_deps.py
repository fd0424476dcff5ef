"""The dashboard's auth and services, on top of api.deps.

Pages send a browser without a valid token to the token form instead of a JSON 401; the JSON
endpoints the pages poll use the API's ReadAuth unchanged.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import Depends, HTTPException, Request

from agent.ops.service import Service
from api.deps import TOKEN_COOKIE, ReadAuth, ServicesDep, require_read
from db.reads import Reads

COOKIE_NAME = TOKEN_COOKIE


def page_auth(request: Request, services: ServicesDep) -> None:
    try:
        require_read(request, services)
    except HTTPException as exc:
        if exc.status_code != 401:
            raise
        target = quote(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        raise HTTPException(
            303, detail="sign in with the token", headers={"Location": f"/ui/login?next={target}"}
        ) from None


def _reads(services: ServicesDep) -> Reads:
    return services.reads


def _service(services: ServicesDep) -> Service:
    return services.service


ReadsDep = Annotated[Reads, Depends(_reads)]
ServiceDep = Annotated[Service, Depends(_service)]
PageAuth = Depends(page_auth)
__all__ = ["COOKIE_NAME", "PageAuth", "ReadAuth", "ReadsDep", "ServiceDep"]
