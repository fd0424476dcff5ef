"""The app factory: the one place (with the CLI) that wires the service's object graph.

Contract other parts rely on:
- `create_app(settings: api.settings.Settings) -> FastAPI`; `app.state.services` is an
  `api.deps.Services` (store, settings, scheduler, repo_for, cancel).
- The dashboard (`api.dashboard.routes.router`, HTML under `/` and `/ui`) is included.
- `api.mcp_http.mount_mcp(app, services)` mounts MCP's streamable HTTP under `/mcp`; if it
  returns an async context manager, it is entered for the life of the app (the lifespan).

Start-up order (lifespan, when `settings.run_scheduler`): take the single-instance lock →
restart recovery → start the slot scheduler. Shutdown reverses it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from agent.recovery import InstanceLock, recover
from agent.scheduler import SchedulerSettings, SlotScheduler, default_loop_factory, gpu_count
from api.dashboard import routes as dashboard_routes
from api.deps import Services
from api.errors import BodyLimitMiddleware, install_error_handlers
from api.mcp_http import mount_mcp
from api.routes import experiments, sweeps, system
from api.settings import Settings
from db.engine import open_database
from db.store import SqlStore

logger = logging.getLogger(__name__)


def _start_scheduler(services: Services) -> SlotScheduler:
    settings = services.settings
    sched_settings = SchedulerSettings(
        db_path=settings.db_path, slots=settings.slots, poll_interval_s=settings.poll_interval_s,
        gpu_count=gpu_count() if settings.gpu_count is None else settings.gpu_count,
        grace_s=settings.grace_s,
    )
    factory = default_loop_factory(services.store, services.repo_for, settings.resolved_work_dir,
                                   sched_settings)
    scheduler = SlotScheduler(services.store, sched_settings, factory)
    scheduler.start()
    return scheduler


def create_app(settings: Settings, *, lock: InstanceLock | None = None) -> FastAPI:
    """Build the app. `lock`: an InstanceLock already held by the caller (`overnight serve`)."""
    engine = open_database(settings.db_path)
    services = Services(settings=settings, store=SqlStore(engine), engine=engine)
    extra_lifespans: list[Any] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        held = lock
        if settings.run_scheduler:
            if held is None or not held.held:
                held = InstanceLock(settings.db_path).acquire()
            services.recovery = recover(services.store, services.repo_for,
                                        settings.resolved_work_dir)
            services.scheduler = _start_scheduler(services)  # slots=0: scheduled starts only
        try:
            async with contextlib.AsyncExitStack() as stack:
                for cm in extra_lifespans:
                    await stack.enter_async_context(cm)
                yield
        finally:
            if services.scheduler is not None:
                services.scheduler.shutdown(timeout_s=settings.grace_s + 10)
            if held is not None:
                held.release()
            engine.dispose()

    app = FastAPI(title="overnight", version="0.1.0", lifespan=lifespan,
                  description="Autonomous ML research loops: queue proposals, run them under a "
                  "fixed budget, keep or reset, all recorded.")
    app.state.services = services
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    for module in (system, sweeps, experiments):
        app.include_router(module.router)
    app.include_router(dashboard_routes.router)
    session_manager = mount_mcp(app, services)
    if hasattr(session_manager, "__aenter__"):
        extra_lifespans.append(session_manager)
    return app


def app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory api.main:app_from_env` (docker): settings from env."""
    import os
    from pathlib import Path

    from agent.wiring import default_db
    from api.settings import TOKEN_ENV, ensure_token

    db = Path(os.environ.get("OVERNIGHT_DB") or default_db())
    token = os.environ.get(TOKEN_ENV) or ensure_token(db)[0]
    host = os.environ.get("OVERNIGHT_HOST", "127.0.0.1")
    settings = Settings.build(db_path=db, host=host, token=token,
                              slots=int(os.environ.get("OVERNIGHT_SLOTS", "1")))
    return create_app(settings)
