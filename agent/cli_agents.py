"""`overnight mcp`, `overnight tools`, `overnight agent-instructions`. Owned by the proposer work."""

from __future__ import annotations
