"""The service's collaborators (`Services`) and the FastAPI dependency aliases routes use.

`ServicesDep` gives a route the Services; `WriteAuth` requires the bearer token (mutating
routes); `ReadAuth` requires it too unless reads were opened (`Settings.read_auth`), and also
accepts the `overnight_token` cookie set by the dashboard's login form (`POST /login`; the
token never travels in a URL). `safe_next` keeps login redirects on-site.

The dashboard's pages: one asked for without a valid token answers 401 with the login form in
place (`LoginRequired`; its `next` is the page), instead of the API's JSON 401; the JSON
endpoints the pages poll use the API's ReadAuth unchanged.

POST /experiments does its blocking work (the database's duplicate check, git applying the
diff, the insert) in worker threads of its own (`AdmissionGate`), never on the event loop. Its
threads are counted by a limiter of their own, not the one plain `def` routes share: a hundred
agents queueing at once cannot take the threads that `GET /health` or a dashboard page need.
Each sweep also has its own limit, so one sweep's flood (or a slow repository) waits behind
itself and never in front of another sweep.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

import anyio
from fastapi import Depends, HTTPException, Request

from agent.core.domain import Sweep
from agent.core.ports import Proposer, Repo
from agent.engine.recovery import DatabaseLock, RecoveryReport
from agent.engine.scheduler import SchedulerSettings, SlotScheduler
from agent.engine.writes import DiskSpaceWatch
from agent.ops.retention import RetentionPolicy
from agent.ops.service import Service
from api.settings import Settings
from db.reads import Reads
from db.store import SqlStore

TOKEN_COOKIE = "overnight_token"
# Where a client finds the token; no path in it (a refusal must not describe the machine).
TOKEN_HINT = ("`overnight token` shows it on the machine that runs the server (with the "
              "server's --db), as does the file `overnight serve` printed at start")


# --- POST /experiments' own worker threads, bounded per sweep ---------------------------------
T = TypeVar("T")
ADMISSIONS_PER_SWEEP = 4  # worker threads one sweep's admissions may hold at once
ADMISSIONS_TOTAL = 24  # worker threads all admissions may hold at once


class AdmissionGate:
    """Runs blocking admission work in worker threads: at most `per_sweep` of one sweep's and
    `total` of all at once. Used on the event loop only (its dict needs no lock)."""

    def __init__(self, per_sweep: int = ADMISSIONS_PER_SWEEP,
                 total: int = ADMISSIONS_TOTAL) -> None:
        self.per_sweep = per_sweep
        self.total = total
        self._threads: anyio.CapacityLimiter | None = None
        self._sweeps: dict[str, anyio.CapacityLimiter] = {}

    async def run(self, sweep: str, work: Callable[[], T]) -> T:
        """`work()` in a worker thread once `sweep` has a free place; its result."""
        async with self._place(sweep):
            if self._threads is None:  # created on the event loop that uses it
                self._threads = anyio.CapacityLimiter(self.total)
            return await anyio.to_thread.run_sync(work, limiter=self._threads)

    @asynccontextmanager
    async def _place(self, sweep: str) -> AsyncIterator[None]:
        limiter = self._sweeps.get(sweep)
        if limiter is None:
            limiter = self._sweeps[sweep] = anyio.CapacityLimiter(self.per_sweep)
        try:
            async with limiter:
                yield
        finally:
            # Forget an idle sweep's limiter: names sent by clients never pile up here.
            stats = limiter.statistics()
            if not stats.borrowed_tokens and not stats.tasks_waiting:
                self._sweeps.pop(sweep, None)


# --- the collaborators and the API's auth -----------------------------------------------------
class Runtime(Protocol):
    """What the API uses of the composition root's object graph (overnight.runtime.Runtime)."""

    store: SqlStore
    reads: Reads
    service: Service
    scheduler: SlotScheduler | None
    recovery: RecoveryReport | None
    disk_space: DiskSpaceWatch  # whether writes fail for lack of space (/health, the 503s)

    def repo_for(self, sweep: Sweep) -> Repo: ...

    def repo_at(self, path: Path) -> Repo: ...

    def make_proposer(self, spec: str, seed: int) -> Proposer | None: ...

    def start_engine(self, settings: SchedulerSettings, *,
                     lock: DatabaseLock | None = None) -> SlotScheduler: ...

    def start_retention(self, policy: RetentionPolicy, every_s: float = ...) -> None: ...

    def close(self, timeout_s: float = 30.0) -> None: ...


@dataclass
class Services:
    """What a route receives: the service's settings and the runtime it serves."""

    settings: Settings
    runtime: Runtime
    followers: int = 0  # open ?follow=1 log streams (changed on the event loop only)
    admissions: AdmissionGate = field(default_factory=AdmissionGate)  # POST /experiments

    @property
    def store(self) -> SqlStore:
        return self.runtime.store

    @property
    def reads(self) -> Reads:
        return self.runtime.reads

    @property
    def service(self) -> Service:
        return self.runtime.service

    @property
    def scheduler(self) -> SlotScheduler | None:
        return self.runtime.scheduler

    def repo_for(self, sweep: Sweep) -> Repo:
        return self.runtime.repo_for(sweep)


async def get_services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


ServicesDep = Annotated[Services, Depends(get_services)]


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def token_matches(settings: Settings, given: str | None) -> bool:
    """Constant-time comparison with the configured token."""
    if not given or not settings.token:
        return False
    return secrets.compare_digest(given.encode(), settings.token.encode())


def _unauthorized(message: str) -> HTTPException:
    return HTTPException(401, detail={"code": "unauthorized", "message": message},
                         headers={"WWW-Authenticate": "Bearer"})


async def require_write(request: Request, services: ServicesDep) -> None:
    settings = services.settings
    if not settings.auth:
        return
    given = _bearer(request)
    if given is None:
        raise _unauthorized(f"this route needs 'Authorization: Bearer <token>'; {TOKEN_HINT}")
    if not token_matches(settings, given):
        raise _unauthorized("invalid token")


def require_read(request: Request, services: ServicesDep) -> None:
    settings = services.settings
    if not settings.reads_need_token:
        return
    given = _bearer(request) or request.cookies.get(TOKEN_COOKIE)
    if given is None:
        raise _unauthorized("this server needs its token for every route but /health: send "
                            "'Authorization: Bearer <token>' or sign in at /ui/login; "
                            + TOKEN_HINT)
    if not token_matches(settings, given):
        raise _unauthorized("invalid token")


WriteAuth = Annotated[None, Depends(require_write)]
ReadAuth = Annotated[None, Depends(require_read)]


def safe_next(raw: str | None) -> str:
    r"""Where to send a browser after login: a path on this site, else `/`.

    Refuses anything a browser could read as another origin: `//host`, `/\host` (browsers
    treat `\` as `/`), control characters (stripped by browsers: `/<TAB>/host`), schemes,
    and the same tricks percent-encoded once or twice (`/%5Chost`, `/%2F%2Fhost`).
    """
    if not raw or not raw.startswith("/"):
        return "/"
    probe = raw
    for _ in range(3):
        probe = unquote(probe)
    if probe.startswith("//") or "\\" in probe:
        return "/"
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in probe):
        return "/"
    parts = urlsplit(probe)
    if parts.scheme or parts.netloc:
        return "/"
    return raw


# --- the dashboard's page auth and services --------------------------------------------------
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
