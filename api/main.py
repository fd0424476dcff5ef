"""The app factory: `create_app(settings, runtime)` turns a Runtime into the HTTP service.

The object graph (store, repositories, service layer, lock, recovery, scheduler) is built by the
composition root (`overnight.runtime.Runtime`) and handed in; this module only adds HTTP:
routes, the dashboard, error handlers, the body limit and the MCP mount.

Contract other parts rely on:
- `app.state.services` is an `api.deps.Services` (settings + runtime).
- The dashboard (`api.dashboard.routes.install`: HTML under `/` and `/ui`) is included; a page
  asked for without the token answers 401 with its login form.
- `api.mcp.http.mount_mcp(app, services)` mounts MCP's streamable HTTP under `/mcp`; the
  context manager it returns is entered for the life of the app (the lifespan).

Lifespan, when `settings.run_scheduler`: `runtime.start_engine` (lock → recovery → slots);
on shutdown `runtime.close()` reverses it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from agent.engine.devices import detect_devices
from agent.engine.recovery import DatabaseLock
from agent.engine.scheduler import SchedulerSettings
from agent.ops.retention import RetentionPolicy, parse_age
from api.dashboard import routes as dashboard_routes
from api.deps import Runtime, Services
from api.docs import install_openapi
from api.errors import BodyLimitMiddleware, install_error_handlers
from api.hostguard import TrustedHostMiddleware, trusted_hosts
from api.mcp.http import mount_mcp
from api.routes import experiments, sweeps, system
from api.settings import Settings

logger = logging.getLogger(__name__)


def scheduler_settings(settings: Settings) -> SchedulerSettings:
    return SchedulerSettings(
        slots=settings.slots, poll_interval_s=settings.poll_interval_s,
        devices=(() if settings.executor != "local" else detect_devices()
                 if settings.devices is None else settings.devices),
        grace_s=settings.grace_s, executor=settings.executor, ray_address=settings.ray_address,
        ray_gpus=settings.ray_gpus, ray_cpus=settings.ray_cpus,
        ray_resources=dict(settings.ray_resources), slurm_partition=settings.slurm_partition,
        slurm_account=settings.slurm_account, slurm_qos=settings.slurm_qos,
        slurm_gpus=settings.slurm_gpus, slurm_gres=settings.slurm_gres,
        slurm_options=tuple(settings.slurm_options),
    )


def create_app(settings: Settings, runtime: Runtime, *,
               lock: DatabaseLock | None = None) -> FastAPI:
    """Build the app on `runtime`. `lock`: an instance lock already held (`overnight serve`)."""
    services = Services(settings=settings, runtime=runtime)
    extra_lifespans: list[Any] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            if settings.run_scheduler:  # slots=0: scheduled starts only
                runtime.start_engine(scheduler_settings(settings), lock=lock)
                if settings.retention:
                    runtime.start_retention(RetentionPolicy(parse_age(settings.retention)))
            async with contextlib.AsyncExitStack() as stack:
                for cm in extra_lifespans:
                    await stack.enter_async_context(cm)
                yield
        finally:
            runtime.close(timeout_s=settings.grace_s + 10)

    app = FastAPI(title="overnight", version="0.1.0", lifespan=lifespan, docs_url=None,
                  description="Autonomous ML research loops: queue proposals, run them under a "
                  "fixed budget, keep or reset, all recorded.")
    app.state.services = services
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    # Added last, so it runs first: a foreign Host is refused before anything else.
    app.add_middleware(TrustedHostMiddleware,
                       allowed=trusted_hosts(settings.host, settings.allowed_hosts))
    for module in (system, sweeps, experiments):
        app.include_router(module.router)
    dashboard_routes.install(app)
    install_openapi(app)
    extra_lifespans.append(mount_mcp(app, services))
    mount_docs(app)
    return app


def mount_docs(app: FastAPI) -> None:
    """Swagger UI at /docs from the swagger-ui-bundle package: no CDN, so it works offline."""
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import HTMLResponse
    from fastapi.staticfiles import StaticFiles
    from swagger_ui_bundle import swagger_ui_path

    app.mount("/docs-static", StaticFiles(directory=str(swagger_ui_path)), name="docs-static")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title="overnight API",
            swagger_js_url="/docs-static/swagger-ui-bundle.js",
            swagger_css_url="/docs-static/swagger-ui.css",
            swagger_favicon_url="/docs-static/favicon-32x32.png")
