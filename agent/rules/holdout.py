"""The sealed holdout metric: take a target's `holdout_metric` out of what a run shows.

The protected harness prints `<holdout_metric>: <value>` in its summary block; the service
records the value on the run and nowhere else: not in the summary, the log tail, the log
file, the live lines. Pure text functions, stdlib only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

SEALED = "sealed"  # what a sealed line's value reads as


def _line(key: str) -> re.Pattern[str]:
    return re.compile(rf"^(\s*{re.escape(key)}\s*:).*$", re.MULTILINE)


def redact(text: str, key: str | None) -> str:
    """`text` with every `<key>: value` line's value replaced by "sealed"."""
    if not key or key not in text:
        return text
    return _line(key).sub(rf"\g<1> {SEALED}", text)


def redact_bytes(data: bytes, key: str | None) -> bytes:
    """The same for a log's bytes (any encoding that keeps ASCII as is)."""
    if not key or key.encode() not in data:
        return data
    pattern = re.compile(rb"^(\s*" + re.escape(key.encode()) + rb"\s*:)[^\n]*$", re.MULTILINE)
    return pattern.sub(rb"\g<1> " + SEALED.encode(), data)


def seal_summary(summary: Mapping[str, Any], key: str | None
                 ) -> tuple[dict[str, Any], float | None]:
    """The summary without the holdout key, and the holdout's value (None: not printed or not
    a finite number)."""
    out = dict(summary)
    if not key:
        return out, None
    raw = out.pop(key, None)
    value = float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else None
    return out, value if value is not None and math.isfinite(value) else None
