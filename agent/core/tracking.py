"""The [track] table of overnight.toml: which experiment tracker mirrors a sweep (MLflow or
W&B), under which experiment or project name, and the dashboard address its runs link to.

Pure: pydantic only. Where the tracker lives (its URI, entity, mode, API key) is not here: the
tracker's own environment variables say it (MLFLOW_TRACKING_URI, WANDB_PROJECT, WANDB_MODE,
…), read by its client (agent.ops.track_mlflow, agent.ops.track_wandb).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, field_validator

TRACKERS = ("mlflow", "wandb")


def tracker_name(value: Any) -> str:
    """`value` as a tracker's name; ValueError naming the choices otherwise."""
    if not isinstance(value, str) or value.strip().lower() not in TRACKERS:
        raise ValueError(f"unknown tracker {value!r} (use {' or '.join(TRACKERS)})")
    return value.strip().lower()


class TrackTable(BaseModel):
    """A target's [track] table (a sweep's `track` setting)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    to: str
    # MLflow's experiment or W&B's project; default $MLFLOW_EXPERIMENT_NAME / $WANDB_PROJECT,
    # else "overnight"
    experiment: str | None = None
    # where the dashboard answers: an experiment's link is <dashboard_url>/ui/experiments/<id>
    # (default: the address `overnight serve` listens on, else http://127.0.0.1:8000)
    dashboard_url: str | None = None

    @field_validator("to", mode="before")
    @classmethod
    def _to(cls, v: Any) -> str:
        return tracker_name(v)

    @field_validator("experiment")
    @classmethod
    def _experiment(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must be a non-empty name (or left out)")
        return None if v is None else v.strip()

    @field_validator("dashboard_url")
    @classmethod
    def _dashboard_url(cls, v: str | None) -> str | None:
        return None if v is None else dashboard_url(v)


def dashboard_url(value: str) -> str:
    """An http(s) base URL without a trailing slash; ValueError otherwise."""
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"must be an http:// or https:// address, got {value!r}")
    return value.strip().rstrip("/")
