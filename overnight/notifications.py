"""Notifications for `overnight run` and `overnight serve`: the --notify URLs and the notify file
(--notify-config, $OVERNIGHT_NOTIFY_CONFIG, else ~/.overnight/notify.toml when it exists) made
into one agent.ops.notify.Notifier on the database's store, its headline the morning report's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from agent.core.ports import Store
from agent.ops.notify import Notifier
from agent.ops.notify_config import NotifyConfig, load_notify_config, target_of
from overnight.environment import notify_config_path

logger = logging.getLogger(__name__)

NotifyOpt = Annotated[list[str] | None, typer.Option(
    "--notify", help="POST an event to this URL on a keep, a crash streak, a plateau, a pause "
    "and the end of the night (repeatable; slack+URL / ntfy+URL name the body, else it is read "
    "off the host)")]
NotifyConfigOpt = Annotated[Path | None, typer.Option(
    help="notify file with \\[\\[notify]] tables (default $OVERNIGHT_NOTIFY_CONFIG, else "
    "~/.overnight/notify.toml when it exists)")]


def notify_config(urls: list[str] | None, path: Path | None) -> NotifyConfig:
    """The notify file's targets (if any) and the --notify URLs; ConfigError on bad input."""
    file, named = notify_config_path(path)
    found = load_notify_config(file) if named or file.is_file() else NotifyConfig([])
    targets = [*found.targets, *(target_of(u) for u in urls or ())]
    return NotifyConfig(targets, found.crash_streak)


def announce(config: NotifyConfig, console: Console) -> None:
    """Say where notifications go (each URL redacted: its secret is never printed)."""
    if config.targets:
        console.print("notifications to " + ", ".join(str(t) for t in config.targets),
                      soft_wrap=True, markup=False)


def make_notifier(store: Store, config: NotifyConfig) -> Notifier | None:
    """A started Notifier for `config`, or None when it names no URL."""
    if not config.targets:
        return None
    from agent.ops.morning import headline_of

    def headline(name: str) -> str:
        return headline_of(store, name).text()

    logger.info("notifications to %s", ", ".join(str(t) for t in config.targets))
    return Notifier(config.targets, store, headline=headline,
                    crash_streak=config.crash_streak).start()
