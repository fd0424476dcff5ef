"""Errors the core raises for bad input; each names the problem so a user can fix it."""

from __future__ import annotations


class OvernightError(Exception):
    """Base class: a user-facing problem with a readable message (no traceback needed)."""


class ConfigError(OvernightError):
    """overnight.toml (or a setting) is invalid; the message names the key."""


class AdmissionError(OvernightError):
    """A proposal was refused before any budget was spent.

    `code` is a stable machine-readable reason; `status_hint` is the HTTP status an API
    adapter should use (409 for a diff that no longer applies, 422 for everything else).
    """

    def __init__(self, code: str, message: str, status_hint: int = 422) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status_hint = status_hint


class PatchError(OvernightError):
    """A diff does not apply to its base commit; the message is git's own."""


class NotFoundError(OvernightError):
    """A sweep or experiment that does not exist."""


class ConflictError(OvernightError):
    """The request is valid but clashes with current state (finished record, duplicate name)."""


class DuplicateError(ConflictError):
    """The same change is already queued or running in the sweep (refused by the insert)."""


class WorkerLostError(OvernightError):
    """The machine (or worker process) executing a run went away before reporting a result.

    Raised by a remote Runner (agent.executors.ray). The run has no outcome: the experiment is
    recorded `interrupted` and re-queued once, never judged on it.
    """


LOST_PREFIX = "the worker running it was lost: "
INTERRUPT_PREFIX = "interrupted by "


class Interrupted(KeyboardInterrupt):
    """A signal (SIGTERM) asked a foreground run to stop: handled exactly like Ctrl-C."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


def interrupt_reason(exc: KeyboardInterrupt) -> str:
    """The recorded reason of a run stopped by Ctrl-C (SIGINT) or SIGTERM."""
    name = getattr(exc, "signal_name", "SIGINT (Ctrl-C)")
    return f"{INTERRUPT_PREFIX}{name} before it finished; `run --resume` runs it again"


class StoreError(OvernightError):
    """The database failed; the message says what was being done."""
