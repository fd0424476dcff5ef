"""LLM proposer profiles: read `[profiles.<name>]` tables from a TOML file; keys only from env.

A profile names a backend (OpenAI-compatible chat completions or Anthropic messages), a base
URL, a model, its context size (or none: the server is asked), the answer format, prices, retry
settings and per-sweep spend caps. The file never holds a key: it
holds the *name* of the environment variable that does (`api_key_env`), so keys never reach
the database or the logs.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from agent.core.config import validation_message
from agent.core.errors import ConfigError

CONFIG_ENV = "OVERNIGHT_LLM_CONFIG"
DEFAULT_CONFIG = Path("~/.overnight/llm.toml")
DEFAULT_BASE_URL = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}
DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


NonNegative = Annotated[float, Field(ge=0)]
# How the answer is asked for: a JSON edit under a schema (OpenAI's response_format json_schema,
# the json_object + schema form of llama-cpp-python and llama.cpp, or a forced tool call), or
# free text. "auto" tries them in that order and keeps the first the server accepts.
AnswerFormat = Literal["auto", "json_schema", "json_object", "tools", "text"]


class LLMProfile(BaseModel):
    """One `[profiles.<name>]` table; keys and bad values are refused naming the key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    backend: Literal["openai", "anthropic"] = "openai"
    model: str
    base_url: str  # default: the backend's public API
    api_key_env: str  # the variable holding the key; "" = send none (default per backend)
    temperature: NonNegative = 0.7
    max_output_tokens: StrictInt = Field(4096, ge=1)  # at most; fitted to the context
    context_tokens: StrictInt | None = Field(None, ge=512)  # None: as the server says, if it does
    answer_format: AnswerFormat = "auto"
    timeout_s: NonNegative = 180.0
    max_retries: StrictInt = Field(4, ge=0)  # HTTP retries on 429/5xx/transport, per call
    backoff_s: NonNegative = 2.0  # first backoff; doubles each retry
    max_backoff_s: NonNegative = 60.0
    answer_retries: StrictInt = Field(2, ge=0)  # re-asks when an answer is unusable
    history_tokens: StrictInt = Field(3000, ge=0)  # prompt budget for the results table
    usd_per_mtok_in: NonNegative = 0.0
    usd_per_mtok_out: NonNegative = 0.0
    max_llm_tokens: StrictInt | None = Field(None, ge=0)  # per sweep, tokens in + out
    max_llm_usd: NonNegative | None = None  # per sweep
    extra_body: dict[str, Any] = Field(default_factory=dict)  # merged into each request body
    omit: tuple[str, ...] = ()  # request keys to drop (e.g. "temperature" for some models)

    @field_validator("temperature", "timeout_s", "backoff_s", "max_backoff_s",
                     "usd_per_mtok_in", "usd_per_mtok_out", "max_llm_usd", mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise ValueError(f"must be a number >= 0, got {v!r}")
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must name the model")
        return v.strip()

    @model_validator(mode="before")
    @classmethod
    def _backend_defaults(cls, data: Any) -> Any:
        backend = data.get("backend", "openai") if isinstance(data, dict) else None
        if backend in DEFAULT_BASE_URL:
            data = {"base_url": DEFAULT_BASE_URL[backend],
                    "api_key_env": DEFAULT_KEY_ENV[backend], **data}
        return data

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")

    def api_key(self) -> str | None:
        """The key from the environment (None when the profile sends none)."""
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env, "").strip()
        if not key:
            raise ConfigError(f"LLM profile {self.name!r}: environment variable "
                              f"{self.api_key_env} is not set (keys come only from the "
                              "environment)")
        return key

    def cost_usd(self, tokens_in: int, tokens_out: int) -> float:
        return (tokens_in * self.usd_per_mtok_in + tokens_out * self.usd_per_mtok_out) / 1e6


def config_path(explicit: Path | str | None = None) -> Path:
    """The profiles' file given (the composition root resolves --llm-config and
    $OVERNIGHT_LLM_CONFIG), else ~/.overnight/llm.toml."""
    raw = explicit or DEFAULT_CONFIG
    return Path(raw).expanduser()


def parse_profile(name: str, table: dict[str, Any], source: str = "llm config") -> LLMProfile:
    where = f"{source} [profiles.{name}]"
    if "api_key" in table or "key" in table:
        raise ConfigError(f"{where}: put the key in an environment variable and name it with "
                          "api_key_env; keys are never read from files")
    unknown = sorted(set(table) - set(LLMProfile.model_fields) | ({"name"} & set(table)))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    if "model" not in table:
        raise ConfigError(f"{where}: missing 'model'")
    try:
        return LLMProfile.model_validate({**table, "name": name})
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, where)) from None


def load_profile(name: str, path: Path | str | None = None) -> LLMProfile:
    """The profile `name` from the config file. Raises ConfigError naming the file and key."""
    file = config_path(path)
    if not file.is_file():
        raise ConfigError(f"LLM profile {name!r}: config file {file} not found (create it with a "
                          f"[profiles.{name}] table, or point ${CONFIG_ENV} at one)")
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: invalid TOML: {exc}") from None
    profiles = data.get("profiles")
    if not isinstance(profiles, dict) or not isinstance(profiles.get(name), dict):
        have = ", ".join(sorted(profiles)) if isinstance(profiles, dict) else "none"
        raise ConfigError(f"{file}: no [profiles.{name}] table (profiles: {have})")
    return parse_profile(name, profiles[name], source=str(file))
