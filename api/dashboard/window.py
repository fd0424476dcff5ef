"""The sweep table's time filter: `since`/`until` from the query string, and its links.

The same filter as `GET /experiments?since=&until=` (experiments *created* in [since, until),
db/keyset.py says why created_at): an ISO 8601 date or date-time (an offset or `Z`, else UTC,
as a `datetime-local` input sends it), or `24h` / `7d` style shorthands, read as that long
before the page view (so a "last 24 h" link and its pager's links stay the last 24 hours).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlencode

from agent.core.domain import as_utc

RELATIVE = re.compile(r"(\d{1,4})([hd])")
# The shortcut links: label -> `since` value ("" = any time).
CHOICES = {"any time": "", "last 24 h": "24h", "last 7 days": "7d"}


@dataclass(frozen=True)
class TimeWindow:
    since_text: str = ""  # as given: kept in every link the page makes
    until_text: str = ""
    since: datetime | None = None
    until: datetime | None = None

    @property
    def active(self) -> bool:
        return self.since is not None or self.until is not None

    def query(self) -> str:
        """`&since=…&until=…` for the page's links (empty when there is no window)."""
        kept = {k: v for k, v in (("since", self.since_text), ("until", self.until_text)) if v}
        return "&" + urlencode(kept) if kept else ""

    def choices(self) -> list[dict[str, str | bool]]:
        """The shortcut links, each with its `since` and whether it is the one shown."""
        return [{"label": label, "query": "&" + urlencode({"since": v}) if v else "",
                 "on": v == self.since_text and not self.until_text}
                for label, v in CHOICES.items()]


def parse_window(since: str | None, until: str | None, now: datetime) -> TimeWindow:
    """The window the query string names. Raises ValueError naming the parameter."""
    s_text, u_text = (since or "").strip(), (until or "").strip()
    lo, hi = _when("since", s_text, now), _when("until", u_text, now)
    if lo is not None and hi is not None and hi <= lo:
        raise ValueError(f"until: {u_text!r} is not after since {s_text!r}")
    return TimeWindow(s_text, u_text, lo, hi)


def _when(name: str, text: str, now: datetime) -> datetime | None:
    if not text:
        return None
    rel = RELATIVE.fullmatch(text)
    if rel:
        n, unit = int(rel.group(1)), rel.group(2)
        return now - (timedelta(hours=n) if unit == "h" else timedelta(days=n))
    try:
        return as_utc(datetime.fromisoformat(text))
    except ValueError:
        raise ValueError(f"{name}: {text!r} is not an ISO 8601 date or date-time "
                         "(e.g. 2026-11-30T06:00Z) or a span like 24h or 7d") from None
