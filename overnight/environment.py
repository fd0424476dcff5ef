"""The environment variables overnight itself reads, as one typed pydantic-settings class.

`OVERNIGHT_DB` (a SQLite path or a postgresql:// URL), `OVERNIGHT_WORK_DIR`, `OVERNIGHT_TOKEN`,
`OVERNIGHT_ALLOWED_HOSTS` (comma-separated), `OVERNIGHT_LLM_CONFIG` and
`OVERNIGHT_NOTIFY_CONFIG`; an empty value counts as unset. Read fresh on each call of
`environment()`, so a command sees the environment it was started with. Only the composition
root (overnight/) reads it; the values are handed down (db, the LLM profiles' file). The variables a
*trainer* reads (OVERNIGHT_BUDGET_S, OVERNIGHT_DEVICE, …) are the guest contract, not settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from agent.core.errors import ConfigError
from db.location import DEFAULT_HOME, DbLocation

PREFIX = "OVERNIGHT_"


class Environment(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", frozen=True)

    db: str | None = None
    work_dir: Path | None = None  # this machine's worktrees and logs (default: db.location's)
    token: SecretStr | None = None
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    llm_config: Path | None = None
    notify_config: Path | None = None

    @field_validator("db", "work_dir", "token", "llm_config", "notify_config", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.strip()
            return value or None
        return value

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(h.strip() for h in value.split(",") if h.strip())
        return value


def environment() -> Environment:
    """The current environment's settings; a bad value is one ConfigError naming the variable."""
    from pydantic import ValidationError

    try:
        return Environment()
    except ValidationError as exc:
        names = ", ".join(PREFIX + str(e["loc"][0]).upper() for e in exc.errors() if e["loc"])
        raise ConfigError(f"bad environment variable(s) {names}: "
                          f"{exc.errors()[0]['msg']}") from None


def default_db() -> DbLocation:
    """`$OVERNIGHT_DB` (a SQLite path or a postgresql:// URL), else `~/.overnight/overnight.db`."""
    return DbLocation.parse(environment().db or DEFAULT_HOME / "overnight.db")


def llm_config_path(explicit: Path | str | None = None) -> Path:
    """--llm-config, else $OVERNIGHT_LLM_CONFIG, else ~/.overnight/llm.toml."""
    from agent.proposers.llm_backends import config_path

    return config_path(explicit or environment().llm_config)


def notify_config_path(explicit: Path | None = None) -> tuple[Path, bool]:
    """--notify-config, else $OVERNIGHT_NOTIFY_CONFIG, else ~/.overnight/notify.toml; and
    whether it was named (a named file must exist, the default one may not)."""
    named = explicit or environment().notify_config
    return (named or DEFAULT_HOME / "notify.toml").expanduser(), named is not None
