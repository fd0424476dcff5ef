"""The service's settings: one typed class, validated at start-up, refusing unsafe values."""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agent.core.errors import ConfigError
from agent.core.private import private_dir
from db.location import DbLocation

MAX_BODY_BYTES = 1024 * 1024
TOKEN_ENV = "OVERNIGHT_TOKEN"
LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname we cannot vouch for counts as exposed


class Settings(BaseModel):
    """Everything `create_app` needs. Build it with `Settings(...)`; bad values raise ConfigError
    (via `Settings.build`) or pydantic's ValidationError."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    db_path: DbLocation  # a SQLite file or a PostgreSQL URL (a path or text is parsed)
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    slots: int = Field(1, ge=0, le=64)  # 0: API only, nothing runs (tests, read replicas)
    token: str | None = None
    auth: bool = True
    read_auth: bool = True  # False: anyone who can connect reads everything (writes: token)
    max_body_bytes: int = Field(MAX_BODY_BYTES, gt=0)
    work_dir: Path | None = None
    poll_interval_s: float = Field(1.0, gt=0)
    grace_s: float = Field(5.0, ge=0)
    run_scheduler: bool = True  # False: no lock, no recovery, no slots (route tests)
    devices: tuple[str, ...] | None = None  # GPU indexes for the slots (None: detect)
    allowed_hosts: tuple[str, ...] = ()  # Host names beyond loopback and the bound one; "*": any
    sse_heartbeat_s: float = Field(15.0, gt=0, le=3600)  # comment line on a silent log stream
    executor: Literal["local", "ray", "slurm"] = "local"  # ray: Ray tasks; slurm: Slurm jobs
    ray_address: str | None = None  # the cluster to join (None: $RAY_ADDRESS or this machine's)
    ray_gpus: float = Field(1.0, ge=0)  # what each run asks of the cluster
    ray_cpus: float = Field(1.0, ge=0)
    ray_resources: dict[str, float] = Field(default_factory=dict)
    slurm_partition: str | None = None  # None: the cluster's default partition
    slurm_account: str | None = None
    slurm_qos: str | None = None
    slurm_gpus: int = Field(1, ge=0)  # --gres=gpu:N per job (0: none)
    slurm_gres: str | None = None  # the site's own --gres instead, e.g. "gpu:a100:1"
    slurm_options: tuple[str, ...] = ()  # extra #SBATCH lines, e.g. "--mem=64G"
    retention: str | None = None  # e.g. "7d": gc experiments finished longer ago (with slots)

    @model_validator(mode="after")
    def _retention(self) -> Settings:
        if self.retention is not None:
            from agent.ops.retention import parse_age

            try:
                parse_age(self.retention)
            except ConfigError as exc:
                raise ValueError(f"retention: {exc}") from None
        return self

    @field_validator("db_path", mode="before")
    @classmethod
    def _location(cls, value: object) -> DbLocation:
        if not isinstance(value, DbLocation | Path | str):
            raise ValueError("give a SQLite file path or a postgresql:// URL")
        return DbLocation.parse(value)

    @model_validator(mode="after")
    def _safe(self) -> Settings:
        if not self.auth and not is_loopback(self.host):
            raise ValueError(f"refusing to bind {self.host} with auth disabled: anyone on the "
                             "network could queue code to run; drop --no-auth or bind 127.0.0.1")
        if self.auth and not self.token:
            raise ValueError("auth is on but no token is set (give --token, set "
                             f"{TOKEN_ENV}, or let `overnight serve` create one)")
        if self.token is not None and len(self.token) < 16:
            raise ValueError("the token must be at least 16 characters")
        return self

    @classmethod
    def build(cls, **values: object) -> Settings:
        """Like the constructor, but every problem is one readable ConfigError."""
        from pydantic import ValidationError

        try:
            return cls(**values)  # type: ignore[arg-type]
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: "
                                 f"{e['msg'].removeprefix('Value error, ')}"
                                 for e in exc.errors())
            raise ConfigError(problems) from None

    @property
    def reads_need_token(self) -> bool:
        """Every route but /health, the login form and static files needs the token: on
        loopback too, since every user of the machine can connect to loopback."""
        return self.auth and self.read_auth

    def open_access_warning(self, port: int | None = None) -> str | None:
        """Who can read (and write) without the token, and what; None when the token guards
        every read."""
        if self.reads_need_token:
            return None
        where = f"{self.host}:{self.port if port is None else port}"
        who = (f"every user of this machine (anyone who can connect to {where})"
               if is_loopback(self.host) else
               f"anyone who can reach {where} over the network")
        what = ("every sweep, experiment, diff, log, report and best file, over the REST API "
                "and the dashboard, without the token")
        if not self.auth:
            return (f"auth is off (--no-auth): {who} can read {what}, and queue code that "
                    "runs as this service's user")
        return (f"reads are open (--open-reads): {who} can read {what}; writes and MCP still "
                "need the token")


def token_file(db: DbLocation | Path | str, work_dir: Path | None = None) -> Path:
    """`<db>.token` beside a SQLite file; `<work dir>/token` for PostgreSQL (no file lives
    beside a server database, and each machine's service has its own token)."""
    where = DbLocation.parse(db)
    if where.path is not None:
        return Path(str(where.path) + ".token")
    return Path(work_dir or where.default_work_dir()).expanduser().resolve() / "token"


def ensure_token(db: DbLocation | Path | str,
                 work_dir: Path | None = None) -> tuple[str, Path, bool]:
    """The token stored beside the database (or in a server database's work dir), created
    (mode 0600) on first use.

    Returns (token, path, created).
    """
    path = token_file(db, work_dir)
    if path.is_file():
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token, path, False
    private_dir(path.parent)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    os.chmod(path, 0o600)
    return token, path, True


class RedactToken(logging.Filter):
    """Takes the token out of log lines (a client may still put it in a URL that the access
    log records)."""

    def __init__(self, token: str | None) -> None:
        super().__init__()
        self.token = token

    def filter(self, record: logging.LogRecord) -> bool:
        if self.token:
            message = record.getMessage()
            if self.token in message:
                record.msg, record.args = message.replace(self.token, "[redacted]"), None
        return True
