"""Where a database lives and what lives beside it: `<db>.work/`, `<db>.lock`, `<db>.token`."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = Path("~/.overnight")
DB_ENV = "OVERNIGHT_DB"


def default_db() -> Path:
    """`$OVERNIGHT_DB`, else `~/.overnight/overnight.db`."""
    return Path(os.environ.get(DB_ENV) or DEFAULT_HOME / "overnight.db").expanduser()


def work_dir_for(db_path: Path | str) -> Path:
    """Worktrees and logs live beside the database, in `<db>.work/` (like `<db>.lock` and
    `<db>.token`), so two databases in one folder never share or prune each other's runs."""
    db = Path(db_path).expanduser().resolve()
    return db.with_name(db.name + ".work")
