"""The OVERNIGHT_* variables, read through one pydantic-settings class, reach every command."""

from __future__ import annotations

import pytest

from agent.core.errors import ConfigError
from overnight.environment import default_db, environment
from overnight.environment import llm_config_path as config_path


def test_unset_and_empty_variables_mean_the_defaults(monkeypatch, tmp_path):
    for name in ("DB", "WORK_DIR", "TOKEN", "ALLOWED_HOSTS", "LLM_CONFIG"):
        monkeypatch.setenv(f"OVERNIGHT_{name}", "  ")
    monkeypatch.setenv("HOME", str(tmp_path))
    env = environment()
    assert (env.db, env.token, env.allowed_hosts, env.llm_config) == (None, None, (), None)
    assert env.work_dir is None
    assert default_db().path == tmp_path / ".overnight" / "overnight.db"
    assert config_path() == tmp_path / ".overnight" / "llm.toml"


def test_values_are_typed_and_the_token_is_not_printed(monkeypatch, tmp_path):
    monkeypatch.setenv("OVERNIGHT_DB", str(tmp_path / "night.db"))
    monkeypatch.setenv("OVERNIGHT_TOKEN", " s3cret-token-0123456789 ")
    monkeypatch.setenv("OVERNIGHT_ALLOWED_HOSTS", "box.lan, gpu-1 ,,")
    monkeypatch.setenv("OVERNIGHT_LLM_CONFIG", str(tmp_path / "llm.toml"))
    monkeypatch.setenv("OVERNIGHT_BUDGET_S", "300")  # a trainer's variable: not a setting
    env = environment()
    assert default_db().path == tmp_path / "night.db"
    assert env.token is not None and env.token.get_secret_value() == "s3cret-token-0123456789"
    assert "s3cret" not in repr(env) and "s3cret" not in str(env)
    assert env.allowed_hosts == ("box.lan", "gpu-1")
    assert config_path() == tmp_path / "llm.toml"
    assert config_path(tmp_path / "given.toml") == tmp_path / "given.toml"


def test_the_environment_is_read_when_asked_not_at_import(monkeypatch, tmp_path):
    monkeypatch.setenv("OVERNIGHT_DB", str(tmp_path / "a.db"))
    assert default_db().path == tmp_path / "a.db"
    monkeypatch.setenv("OVERNIGHT_DB", str(tmp_path / "b.db"))
    assert default_db().path == tmp_path / "b.db"
    monkeypatch.setenv("OVERNIGHT_DB", "postgresql://team@db.lan:5433/nights")
    assert not default_db().is_sqlite and str(default_db()) == (
        "postgresql://team@db.lan:5433/nights")
    monkeypatch.setenv("OVERNIGHT_WORK_DIR", str(tmp_path / "w"))
    assert environment().work_dir == tmp_path / "w"


def test_a_bad_value_names_the_variable(monkeypatch):
    from overnight import environment as module

    class Strict(module.Environment):
        retries: int = 0

    monkeypatch.setattr(module, "Environment", Strict)
    monkeypatch.setenv("OVERNIGHT_RETRIES", "many")
    with pytest.raises(ConfigError, match="OVERNIGHT_RETRIES"):
        module.environment()
