"""What a finished run looks like: how the child ended, its summary block, log tail and error line.

Plain data and one pure text helper, stdlib only. Guaranteed: a RunResult is immutable and
``error`` is taken from the log text alone. Not guaranteed: that ``error`` names the root cause
(it is the last exception line printed, which for chained exceptions is the outermost one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

TAIL_LINES = 50
TRACEBACK_HEADER = "Traceback (most recent call last):"

_NAME = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
# Inside a traceback the first unindented line is the exception line, whatever its name.
_ANY_EXCEPTION_LINE = re.compile(rf"^{_NAME}(?::.*)?$")
# Outside one (SyntaxError in the main script prints no header), only names that look like
# exceptions count, so ordinary output such as "Done" or "loss: 3.1" is not mistaken for one.
_NAMED_EXCEPTION_LINE = re.compile(
    rf"^(?:{_NAME}\.)?[A-Za-z0-9_]*"
    r"(?:Error|Exception|Interrupt|Exit|StopIteration|StopAsyncIteration)(?::.*)?$"
)


class Outcome(str, Enum):
    """How the child ended."""

    EXITED = "exited"  # exited by itself (any exit code)
    TIMED_OUT = "timed_out"  # killed by us at the hard limit
    STOPPED = "stopped"  # killed by us because the caller asked (stop_event)
    SIGNALED = "signaled"  # died from a signal we did not send (e.g. OOM killer)
    FAILED_TO_START = "failed_to_start"  # exec failed (command not found, etc.)


@dataclass(frozen=True)
class RunResult:
    """The outcome of one run_command call; a failing child is a result, never an exception."""

    outcome: Outcome
    exit_code: int | None  # None unless EXITED
    signal: int | None  # the signal that ended it, if any
    wall_s: float  # wall seconds from spawn to end
    summary: dict[str, float | str]  # parsed summary block, {} if none
    fail_marker: bool  # a FAIL line was printed
    log_path: Path
    log_tail: str  # last TAIL_LINES lines of the log
    pgid: int | None
    error: str | None = None  # last exception line, or why the command failed to start

    @property
    def ok(self) -> bool:
        """Exited by itself with code 0 and printed no FAIL line."""
        return self.outcome is Outcome.EXITED and self.exit_code == 0 and not self.fail_marker


def _first_unindented(lines: list[str]) -> str | None:
    """The exception line of one traceback: its first non-empty line that is not indented."""
    for line in lines:
        if line.strip() and not line[0].isspace():
            stripped = line.rstrip()
            return stripped if _ANY_EXCEPTION_LINE.match(stripped) else None
    return None


def last_error_line(text: str) -> str | None:
    """The last line that looks like a Python exception line, e.g. ``NameError: name 'x' ...``.

    If the text holds a ``Traceback (most recent call last):`` header, only the text after the
    last one is searched. Returns None when nothing looks like an exception.
    """
    lines = text.splitlines()
    headers = [i for i, line in enumerate(lines) if line.strip() == TRACEBACK_HEADER]
    if headers:
        lines = lines[headers[-1] + 1 :]
        found = _first_unindented(lines)
        if found is not None:
            return found
    for line in reversed(lines):
        stripped = line.strip()
        if _NAMED_EXCEPTION_LINE.match(stripped):
            return stripped
    return None


def tail_lines(text: str, count: int = TAIL_LINES) -> str:
    """The last ``count`` lines of ``text``, joined with newlines."""
    return "\n".join(text.splitlines()[-count:])
