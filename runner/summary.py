"""Parse a training log: the final ``---`` summary block, the ``FAIL`` marker and progress lines.

Pure text functions, stdlib only. Guaranteed: they never raise on any input string. Not
guaranteed: that a block was written by the script we think (the last ``---`` block wins).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SUMMARY_SEPARATOR = "---"
FAIL_MARKER = "FAIL"

_SUMMARY_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(.*?)\s*$")
_NUMBER = r"[-+]?(?:nan|inf(?:inity)?|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"
# A field name must not be glued to a word character or a dot on its left (`val_loss`,
# `x.loss`), and may be followed by `:`, `=` or spaces before its value.
_STEP = re.compile(r"(?<![\w.])step\s*[:=]?\s*(\d+)", re.IGNORECASE)
_LOSS = re.compile(rf"(?<![\w.])loss\s*[:=]?\s*({_NUMBER})(?![\w.])", re.IGNORECASE)
_SECONDS = r"\s*(?:seconds|secs?|s)"
# The training time a progress line prints: `elapsed 31.2s`, `elapsed=3.4`, `time 1.2s` (in
# seconds; not a step's, an epoch's or a batch's time), or a field of its own, `| 0.7s`.
_ELAPSED = (
    re.compile(rf"(?<![\w.])elapsed\s*[:=]?\s*({_NUMBER})(?:{_SECONDS})?(?![\w.])", re.I),
    re.compile(rf"(?<![\w.])(?<!step )(?<!iter )(?<!epoch )(?<!batch )time\s*[:=]?\s*"
               rf"({_NUMBER}){_SECONDS}(?![\w./])", re.I),
    re.compile(rf"(?:^|\|)\s*({_NUMBER}){_SECONDS}\s*(?=\||$)", re.I),
)


@dataclass(frozen=True)
class ProgressPoint:
    """One progress line: the optimizer step, the training loss and, if printed, elapsed seconds."""

    step: int
    loss: float
    elapsed_s: float | None


def _to_value(raw: str) -> float | str:
    """float() where possible (``nan`` and ``inf`` included), else the stripped string."""
    text = raw.strip()
    try:
        return float(text)
    except ValueError:
        return text


def parse_summary(text: str) -> dict[str, float | str]:
    """Parse the ``key: value`` lines after the last line that is exactly ``---``.

    Parsing stops at the first line that is not ``key: value``. Returns ``{}`` if there is no
    ``---`` line. A repeated key keeps its last value.
    """
    lines = text.splitlines()
    start = None
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].strip() == SUMMARY_SEPARATOR:
            start = index + 1
            break
    if start is None:
        return {}
    summary: dict[str, float | str] = {}
    for line in lines[start:]:
        match = _SUMMARY_LINE.match(line)
        if match is None:
            break
        summary[match.group(1)] = _to_value(match.group(2))
    return summary


def has_fail_marker(text: str) -> bool:
    """True if some line is exactly ``FAIL`` (surrounding whitespace ignored)."""
    return any(line.strip() == FAIL_MARKER for line in text.splitlines())


def find_elapsed(line: str) -> float | None:
    """The training seconds a progress line prints (see `_ELAPSED`), else None."""
    for pattern in _ELAPSED:
        found = pattern.search(line)
        if found is not None:
            return float(found.group(1))
    return None


def parse_custom_progress(line: str, pattern: re.Pattern[str]) -> ProgressPoint | None:
    """Parse a line with a target's own `progress_regex`: named groups `loss` (required),
    `step` and `elapsed` (optional; without `step` the caller numbers the points, step -1;
    without an `elapsed` group, the line's elapsed time as find_elapsed reads it)."""
    match = pattern.search(line)
    if match is None:
        return None
    groups = match.groupdict()
    try:
        loss = float(groups["loss"])
        step = int(groups["step"]) if groups.get("step") else -1
        elapsed = float(groups["elapsed"]) if groups.get("elapsed") else (
            None if "elapsed" in pattern.groupindex else find_elapsed(line))
    except (KeyError, TypeError, ValueError):
        return None
    return ProgressPoint(step=step, loss=loss, elapsed_s=elapsed)


def parse_progress(line: str, pattern: re.Pattern[str] | None = None) -> ProgressPoint | None:
    """Parse a progress line such as ``step 120 | loss 3.41 | elapsed 31.2s``.

    Tolerates ``step 00120/01000 (12.0%) | loss: 3.41 | elapsed: 31.2s``, ``step=120 loss=3.41``
    and extra fields in any order; the elapsed time may also read ``time 1.2s`` or ``| 1.2s``.
    Returns None unless both a step and a loss are present. With a `pattern` (a target's
    `progress_regex`), lines it matches are parsed by it first.
    """
    if pattern is not None:
        custom = parse_custom_progress(line, pattern)
        if custom is not None:
            return custom
    step = _STEP.search(line)
    loss = _LOSS.search(line)
    if step is None or loss is None:
        return None
    return ProgressPoint(step=int(step.group(1)), loss=float(loss.group(1)),
                         elapsed_s=find_elapsed(line))
