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


class NotFoundError(OvernightError):
    """A sweep or experiment that does not exist."""


class ConflictError(OvernightError):
    """The request is valid but clashes with current state (finished record, duplicate name)."""


class StoreError(OvernightError):
    """The database failed; the message says what was being done."""
