"""The service's collaborators (`Services`) and the FastAPI dependency aliases routes use.

`ServicesDep` gives a route the Services; `WriteAuth` requires the bearer token (mutating
routes); `ReadAuth` requires it only when reads are protected (non-loopback bind, or settings
say so) and also accepts the `overnight_token` cookie set by `GET /login?token=...`.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from sqlalchemy import Engine

from agent.domain import Experiment, ExperimentStatus, Finish, Sweep
from agent.errors import ConflictError
from agent.gitrepo import GitRepo
from api.settings import Settings
from db.store import SqlStore

TOKEN_COOKIE = "overnight_token"


@dataclass
class Services:
    settings: Settings
    store: SqlStore
    engine: Engine
    scheduler: Any = None  # agent.scheduler.SlotScheduler once started (None: API only)
    recovery: Any = None  # agent.recovery.RecoveryReport of this start
    _repos: dict[str, GitRepo] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def repo_for(self, sweep: Sweep) -> GitRepo:
        """The sweep's target repository (one adapter per target, shared)."""
        with self._lock:
            repo = self._repos.get(sweep.target_path)
            if repo is None:
                repo = self._repos[sweep.target_path] = GitRepo(sweep.target_path)
            return repo

    def cancel(self, experiment_id: int) -> tuple[Experiment, bool]:
        """Cancel a queued experiment now, or ask a running one to stop.

        Returns (experiment, pending): pending is True when a running experiment was asked to
        stop and will be recorded `cancelled` shortly. Raises NotFoundError, ConflictError.
        """
        exp = self.store.get_experiment(experiment_id)
        if exp.status.is_finished():
            raise ConflictError(f"experiment {exp.id} is already {exp.status.value}; finished "
                                "records cannot be changed")
        if exp.status is ExperimentStatus.QUEUED:
            # Claim first (a guarded update) so no slot can start it while we cancel it.
            if self.store.claim(exp.id) is not None:
                done = self.store.finish(exp.id, Finish(ExperimentStatus.CANCELLED,
                                                        reason="cancelled by request"))
                return done, False
        if self.scheduler is not None and self.scheduler.cancel(exp.id):
            return self.store.get_experiment(exp.id), True
        exp = self.store.get_experiment(experiment_id)
        if exp.status.is_finished():
            raise ConflictError(f"experiment {exp.id} is already {exp.status.value}")
        raise ConflictError(f"experiment {exp.id} is running but not in this service's slots; "
                            "it cannot be cancelled from here")


def get_services(request: Request) -> Services:
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


def require_write(request: Request, services: ServicesDep) -> None:
    settings = services.settings
    if not settings.auth:
        return
    given = _bearer(request)
    if given is None:
        raise _unauthorized("this route needs 'Authorization: Bearer <token>' (the token is "
                            "in the file printed by `overnight serve`)")
    if not token_matches(settings, given):
        raise _unauthorized("invalid token")


def require_read(request: Request, services: ServicesDep) -> None:
    settings = services.settings
    if not settings.reads_need_token:
        return
    given = _bearer(request) or request.cookies.get(TOKEN_COOKIE)
    if given is None:
        raise _unauthorized("this server requires a token for every route: send "
                            "'Authorization: Bearer <token>' or open /login?token=<token>")
    if not token_matches(settings, given):
        raise _unauthorized("invalid token")


WriteAuth = Annotated[None, Depends(require_write)]
ReadAuth = Annotated[None, Depends(require_read)]
