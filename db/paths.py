"""Where a database lives and what lives beside it: `<db>.work/`, `<db>.lock`, `<db>.token`
(for a PostgreSQL URL, see db.location: a local work dir and an advisory lock instead)."""

from __future__ import annotations

from pathlib import Path

from db.location import DbLocation


def work_dir_for(db_path: DbLocation | Path | str) -> Path:
    """Worktrees and logs live beside the database, in `<db>.work/` (like `<db>.lock` and
    `<db>.token`), so two databases in one folder never share or prune each other's runs."""
    return DbLocation.parse(db_path).default_work_dir()
