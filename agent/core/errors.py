"""Errors the core raises for bad input; each names the problem so a user can fix it."""

from __future__ import annotations

import errno


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


class RunNotStartedError(OvernightError):
    """The executor could not start a run: sbatch refused its job, no node of the Ray cluster
    can hold it, a GPU was asked for where there is none. Raised by a Runner before the
    training command starts; the message is one sentence, with the fix. Neither the change's
    fault nor an interruption: the experiment is recorded `not started` and queued again, and
    its sweep pauses until the fix (agent.engine.scheduler)."""


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
    """The database failed; the message says what was being done. `out_of_space`: it could
    not write for lack of space (its disk or quota is full), which waiting can cure."""

    def __init__(self, message: str, *, out_of_space: bool = False) -> None:
        super().__init__(message)
        self.out_of_space = out_of_space


class OutOfSpaceError(OvernightError):
    """A run failed while the service's own writes failed for lack of space: the disk, not the
    change, ended it (an interruption, re-run once space returns)."""


NO_SPACE_PREFIX = "interrupted for lack of space: "
# How a lack of space reads: errno 28/122, and the words SQLite, PostgreSQL, git and Python use.
OUT_OF_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
OUT_OF_SPACE_WORDS = ("No space left on device", "Disk quota exceeded",
                      "database or disk is full", "[Errno 28]")


def says_out_of_space(text: str | None) -> bool:
    """Does this message (an error, a log's tail) say a write failed for lack of space?"""
    return text is not None and any(word in text for word in OUT_OF_SPACE_WORDS)


def is_out_of_space(exc: BaseException) -> bool:
    """A write failed for lack of space (the database's, a log's, git's): a pause to wait out,
    never a verdict on the experiment or the request."""
    if isinstance(exc, StoreError):
        return exc.out_of_space
    if isinstance(exc, OutOfSpaceError):
        return True
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno in OUT_OF_SPACE_ERRNOS
    return isinstance(exc, Exception) and says_out_of_space(str(exc))  # git's own words
