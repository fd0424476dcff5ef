"""LLM proposer profiles: read `[profiles.<name>]` tables from a TOML file; keys only from env.

A profile names a backend (OpenAI-compatible chat completions or Anthropic messages), a base
URL, a model, prices, retry settings and per-sweep spend caps. The file never holds a key: it
holds the *name* of the environment variable that does (`api_key_env`), so keys never reach
the database or the logs.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from agent.errors import ConfigError

CONFIG_ENV = "OVERNIGHT_LLM_CONFIG"
DEFAULT_CONFIG = Path("~/.overnight/llm.toml")
BACKENDS = ("openai", "anthropic")
DEFAULT_BASE_URL = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}
DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


@dataclass(frozen=True)
class LLMProfile:
    name: str
    backend: str
    model: str
    base_url: str
    api_key_env: str  # "" = send no key (local servers)
    temperature: float = 0.7
    max_output_tokens: int = 4096
    timeout_s: float = 180.0
    max_retries: int = 4  # HTTP retries on 429/5xx/transport errors, per call
    backoff_s: float = 2.0  # first backoff; doubles each retry
    max_backoff_s: float = 60.0
    answer_retries: int = 2  # re-asks with the error shown when an answer is unusable
    history_tokens: int = 3000  # prompt budget for the results table
    usd_per_mtok_in: float = 0.0
    usd_per_mtok_out: float = 0.0
    max_llm_tokens: int | None = None  # per sweep, tokens in + out
    max_llm_usd: float | None = None  # per sweep
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into each request body
    omit: tuple[str, ...] = ()  # request keys to drop (e.g. "temperature" for some models)

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


_NUMBERS = {f.name for f in fields(LLMProfile)} - {"name", "backend", "model", "base_url",
                                                   "api_key_env", "extra_body", "omit"}


def config_path(explicit: Path | str | None = None) -> Path:
    """--llm-config, else $OVERNIGHT_LLM_CONFIG, else ~/.overnight/llm.toml."""
    raw = explicit or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG
    return Path(raw).expanduser()


def parse_profile(name: str, table: dict[str, Any], source: str = "llm config") -> LLMProfile:
    where = f"{source} [profiles.{name}]"
    if "api_key" in table or "key" in table:
        raise ConfigError(f"{where}: put the key in an environment variable and name it with "
                          "api_key_env; keys are never read from files")
    known = {f.name for f in fields(LLMProfile)} - {"name"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    backend = table.get("backend", "openai")
    if backend not in BACKENDS:
        raise ConfigError(f"{where}: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    model = table.get("model")
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"{where}: missing 'model'")
    base_url = str(table.get("base_url") or DEFAULT_BASE_URL[backend]).rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}: base_url must start with http:// or https://")
    key_env = table.get("api_key_env", DEFAULT_KEY_ENV[backend])
    if not isinstance(key_env, str):
        raise ConfigError(f"{where}: api_key_env must be the name of an environment variable")
    values: dict[str, Any] = {}
    for key in _NUMBERS & set(table):
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ConfigError(f"{where}: {key} must be a number >= 0, got {value!r}")
        values[key] = value
    extra, omit = table.get("extra_body", {}), table.get("omit", [])
    if not isinstance(extra, dict) or not isinstance(omit, list) or not all(
            isinstance(o, str) for o in omit):
        raise ConfigError(f"{where}: extra_body must be a table and omit a list of key names")
    values["extra_body"], values["omit"] = extra, tuple(omit)
    for key in ("max_output_tokens", "max_retries", "answer_retries", "history_tokens",
                "max_llm_tokens"):
        if key in values:
            values[key] = int(values[key])
    return LLMProfile(name=name, backend=backend, model=model.strip(), base_url=base_url,
                      api_key_env=key_env, **values)


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
