"""Where a database lives and what lives beside it: `<db>.work/`, `<db>.lock`, `<db>.token`."""

from __future__ import annotations

from pathlib import Path

from agent.environment import environment

DEFAULT_HOME = Path("~/.overnight")


def default_db() -> Path:
    """`$OVERNIGHT_DB`, else `~/.overnight/overnight.db`."""
    return Path(environment().db or DEFAULT_HOME / "overnight.db").expanduser()


def work_dir_for(db_path: Path | str) -> Path:
    """Worktrees and logs live beside the database, in `<db>.work/` (like `<db>.lock` and
    `<db>.token`), so two databases in one folder never share or prune each other's runs."""
    db = Path(db_path).expanduser().resolve()
    return db.with_name(db.name + ".work")
