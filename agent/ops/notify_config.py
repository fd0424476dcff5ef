"""Where notifications go: `--notify URL` values and the `[[notify]]` tables of a notify file
(default ~/.overnight/notify.toml), checked, with each URL's format (json, slack, ntfy) and the
events it wants; and `redact`, the only form of a URL that is ever logged or printed.

A URL's format is named by a prefix (`slack+https://…`, `ntfy+https://…`, `json+https://…`) or
the file's `format` key, else read off the host (hooks.slack.com: slack; a host with "ntfy" in
it: ntfy; anything else: overnight's JSON event). Bad input is one ConfigError naming it (the
URL redacted). Pure apart from reading the file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent.core.errors import ConfigError
from agent.ops.notify_watch import CRASH_STREAK_DEFAULT, EVENTS

FORMATS = ("json", "slack", "ntfy")
FILE_KEYS = {"crash_streak", "notify"}
TARGET_KEYS = {"url", "format", "events"}


def redact(url: str) -> str:
    """scheme://host[:port] and "/…" for any path: userinfo, path, query and fragment can all
    carry a secret (Slack's webhook path is the token, an ntfy topic is its password)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an unreadable URL)"
    host = f"[{host}]" if ":" in host else host
    rest = "/…" if parts.path.strip("/") or parts.query or parts.fragment else ""
    return f"{parts.scheme or '?'}://{host}{port}{rest}"


@dataclass(frozen=True)
class NotifyTarget:
    url: str
    format: str = "json"
    events: frozenset[str] = field(default_factory=lambda: frozenset(EVENTS))

    def __str__(self) -> str:  # what a log line or a listing may show
        return f"{self.format} {redact(self.url)}"


@dataclass(frozen=True)
class NotifyConfig:
    targets: list[NotifyTarget]
    crash_streak: int = CRASH_STREAK_DEFAULT


def target_of(spec: str, fmt: str | None = None,
              events: frozenset[str] | None = None) -> NotifyTarget:
    """One URL (with an optional `format+` prefix) as a target; ConfigError if it is not one."""
    spec = spec.strip()
    head, plus, rest = spec.partition("+")
    if plus and head in FORMATS and rest.startswith(("http://", "https://")):
        fmt, spec = fmt or head, rest
    try:
        parts = urlsplit(spec)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise ConfigError(f"notify: {redact(spec)} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"notify: {redact(spec)} is not an http:// or https:// URL")
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"notify: format {fmt!r} for {redact(spec)}: use one of "
                          f"{', '.join(FORMATS)}")
    return NotifyTarget(spec, fmt or _guess(parts.hostname), events or frozenset(EVENTS))


def _guess(host: str) -> str:
    if host == "hooks.slack.com":
        return "slack"
    return "ntfy" if "ntfy" in host else "json"


def load_notify_config(path: Path) -> NotifyConfig:
    """The notify file: `crash_streak = N` and `[[notify]]` tables (url, format, events)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = set(data) - FILE_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} (known: "
                          f"{', '.join(sorted(FILE_KEYS))})")
    streak = data.get("crash_streak", CRASH_STREAK_DEFAULT)
    if not isinstance(streak, int) or isinstance(streak, bool) or not 1 <= streak <= 100:
        raise ConfigError(f"{path}: crash_streak must be a whole number from 1 to 100")
    tables = data.get("notify", [])
    if not isinstance(tables, list):
        raise ConfigError(f"{path}: write each URL as a [[notify]] table")
    return NotifyConfig([_table(path, i, t) for i, t in enumerate(tables)], streak)


def _table(path: Path, i: int, t: Any) -> NotifyTarget:
    where = f"{path}: [[notify]] #{i + 1}"
    if not isinstance(t, dict):
        raise ConfigError(f"{where} is not a table")
    unknown = set(t) - TARGET_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    if not isinstance(t.get("url"), str):
        raise ConfigError(f"{where}: needs url = \"https://…\"")
    events = t.get("events")
    if events is not None:
        if not isinstance(events, list) or not events or any(e not in EVENTS for e in events):
            raise ConfigError(f"{where}: events must list some of {', '.join(EVENTS)}")
        events = frozenset(events)
    fmt = t.get("format")
    if fmt is not None and not isinstance(fmt, str):
        raise ConfigError(f"{where}: format must be one of {', '.join(FORMATS)}")
    try:
        return target_of(t["url"], fmt, events)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
