"""The HTTP service: FastAPI app factory, routes, dashboard, MCP mount. Nothing imports api."""
