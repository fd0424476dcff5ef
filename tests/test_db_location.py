"""`--db` / OVERNIGHT_DB as a path or a PostgreSQL URL, and where each keeps its local files."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.settings import Settings, ensure_token, token_file
from db.location import DbLocation, DbLocationError


def test_paths_and_sqlite_urls_are_files(tmp_path: Path, monkeypatch) -> None:  # type: ignore
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for given, want in [(tmp_path / "a.db", tmp_path / "a.db"), ("b.db", tmp_path / "b.db"),
                        ("~/c.db", tmp_path / "home" / "c.db"),
                        (f"sqlite:///{tmp_path}/d.db", tmp_path / "d.db")]:
        where = DbLocation.parse(given)
        assert where.is_sqlite and where.path == want and str(where) == str(want)
        assert where.default_work_dir() == want.with_name(want.name + ".work")
        assert token_file(where) == want.with_name(want.name + ".token")


def test_a_postgresql_url_keeps_its_password_out_of_messages(tmp_path: Path,
                                                             monkeypatch) -> None:  # type: ignore
    monkeypatch.setenv("HOME", str(tmp_path))
    where = DbLocation.parse("postgres://team:s3cret@db.lan:5433/nights?sslmode=require")
    assert not where.is_sqlite and where.path is None
    assert where.url == "postgresql+psycopg://team:s3cret@db.lan:5433/nights?sslmode=require"
    assert str(where) == "postgresql://team:***@db.lan:5433/nights?sslmode=require"
    assert where == DbLocation.parse("postgresql://team:s3cret@db.lan:5433/nights?sslmode=require")
    work = tmp_path / ".overnight" / "db.lan-5433-nights.work"
    assert where.default_work_dir() == work
    assert token_file(where) == work / "token"
    assert token_file(where, tmp_path / "w") == tmp_path / "w" / "token"
    token, path, created = ensure_token(where, tmp_path / "w")
    assert created and path == tmp_path / "w" / "token" and path.stat().st_mode & 0o777 == 0o600
    assert ensure_token(where, tmp_path / "w") == (token, path, False)
    settings = Settings.build(db_path="postgresql://team@db.lan/nights", token="t" * 16)
    assert settings.work_dir is None  # the default, beside what the URL names:
    assert settings.db_path.default_work_dir() == tmp_path / ".overnight" / "db.lan-nights.work"


@pytest.mark.parametrize("bad, message", [
    ("mysql://u@h/x", "unsupported database URL scheme 'mysql'"),
    ("postgresql://u@h", "needs a database name"),
    ("postgresql://u@h:notaport/x", "not a database URL"),
    ("   ", "empty"),
])
def test_a_bad_location_names_the_problem(bad: str, message: str) -> None:
    with pytest.raises(DbLocationError, match=message):
        DbLocation.parse(bad)
