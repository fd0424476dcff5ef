"""The app factory: the one place (with the CLI) that wires the service's object graph.

SKELETON — owned by the service work (issue 3). Contract other parts rely on:
- `create_app(settings: api.settings.Settings) -> FastAPI`; `app.state.services` is an
  `api.deps.Services` (store, settings, scheduler, ...).
- The dashboard's `api.dashboard.routes.router` (an APIRouter serving HTML under `/`) is included.
- `api.mcp_http.mount_mcp(app, services)` mounts MCP's streamable HTTP under `/mcp`.
"""
