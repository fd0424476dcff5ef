"""`overnight serve`: the long-running service (uvicorn + APScheduler). Owned by the service work."""

from __future__ import annotations
