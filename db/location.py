"""Where a database lives: a SQLite file path or a PostgreSQL URL, as one small typed value.

`--db`, `OVERNIGHT_DB` and the settings all take either; everything that needs a local folder
(worktrees, logs, the service token) asks the location for its local home, because a URL has
no folder beside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

DEFAULT_HOME = Path("~/.overnight")
POSTGRES_SCHEMES = ("postgresql", "postgres")
POSTGRES_DRIVER = "postgresql+psycopg"  # psycopg 3: the `postgres` extra
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class DbLocationError(ValueError):
    """A --db / OVERNIGHT_DB value that names no database overnight can open."""


@dataclass(frozen=True)
class DbLocation:
    """A SQLite file (`path`) or a PostgreSQL server database (`pg_url`), never both."""

    path: Path | None = None
    pg_url: URL | None = None

    @classmethod
    def parse(cls, value: DbLocation | Path | str) -> DbLocation:
        """A path (`~/x.db`, `sqlite:///x.db`) or `postgresql://user@host[:port]/dbname`.

        Raises DbLocationError naming the problem (another scheme, a URL without a database).
        """
        if isinstance(value, DbLocation):
            return value
        if isinstance(value, Path):
            return cls(path=value.expanduser().resolve())
        text = value.strip()
        if not text:
            raise DbLocationError("the database location is empty")
        scheme = _SCHEME.match(text)
        if scheme is None:
            return cls(path=Path(text).expanduser().resolve())
        name = scheme.group(1).lower()
        if name == "sqlite":
            return cls(path=Path(text[len("sqlite:///"):]).expanduser().resolve())
        if name.split("+")[0] not in POSTGRES_SCHEMES:
            raise DbLocationError(f"unsupported database URL scheme {name!r}: give a SQLite "
                                  "file path or postgresql://user@host/dbname")
        return cls(pg_url=_postgres_url(text))

    @property
    def is_sqlite(self) -> bool:
        return self.path is not None

    @property
    def url(self) -> str:
        """The SQLAlchemy URL (with the password, if one was given: never print it)."""
        if self.path is not None:
            return f"sqlite:///{self.path}"
        assert self.pg_url is not None
        return self.pg_url.render_as_string(hide_password=False)

    def __str__(self) -> str:
        """For messages and printed commands: the path, or the URL with any password masked
        (libpq reads it from ~/.pgpass or $PGPASSWORD instead)."""
        if self.path is not None:
            return str(self.path)
        assert self.pg_url is not None
        return self.pg_url.set(drivername="postgresql").render_as_string(hide_password=True)

    @property
    def local_home(self) -> Path:
        """The stem that local companions hang off: the SQLite file itself (`<db>.work`,
        `<db>.lock`, `<db>.token`), or `~/.overnight/<host>-<dbname>` for a server."""
        if self.path is not None:
            return self.path
        assert self.pg_url is not None
        host = self.pg_url.host or "localhost"
        port = f"-{self.pg_url.port}" if self.pg_url.port else ""
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", f"{host}{port}-{self.pg_url.database}")
        return (DEFAULT_HOME / stem).expanduser().resolve()

    def default_work_dir(self) -> Path:
        """Worktrees and logs: `<db>.work/` beside a SQLite file, so two databases in one
        folder never share or prune each other's runs; `~/.overnight/<host>-<dbname>.work`
        for PostgreSQL (each machine keeps its own)."""
        home = self.local_home
        return home.with_name(home.name + ".work")


def _postgres_url(text: str) -> URL:
    try:
        url = make_url(text)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        raise DbLocationError(f"not a database URL: {exc}") from None
    if not url.database:
        raise DbLocationError("a PostgreSQL URL needs a database name: "
                              "postgresql://user@host/dbname")
    return url.set(drivername=POSTGRES_DRIVER)
