"""What the LLM proposer talks to: its profiles, chat backends, wire formats and token budget.

Profiles: `[profiles.<name>]` tables read from a TOML file. A profile names a backend
(OpenAI-compatible chat completions or Anthropic messages), a base URL, a model, its context
size (or none: the server is asked), the answer format, prices, retry settings and per-sweep
spend caps. The file never holds a key: it holds the *name* of the environment variable that
does (`api_key_env`), so keys never reach the database or the logs.

Backends: plain HTTP (httpx). Bounded retries with exponential backoff (and Retry-After) on
429, 5xx and connection errors; never after a timeout (the server may still be generating the
abandoned request: asking again would double its load). Any other HTTP error fails at once,
classified (`LLMError.kind`) so the proposer can tell a prompt too long for the context, an
answer format the server refuses, a timeout and a transient outage from a fatal error. Keys
travel only in request headers and never appear in an error message or a log line.

The structured answer (pure): a JSON edit under a schema, how each API is asked for it, and how
it is read back into files. The edit is a description, a category and a short list of
search/replace edits. Where the editable files are small enough, `search` is an enum of the
files' unique lines, so a server that enforces the schema by grammar (llama.cpp, vLLM) can only
name a line that exists: the answer is well-formed by construction and admission, not parsing,
judges it. The ways to ask: OpenAI's `response_format` json_schema, the `json_object` +
`schema` form (llama-cpp-python, llama.cpp), a forced tool call (OpenAI tools, Anthropic
tool_use); "text" asks for none.

The token budget (pure): fit a prompt and its answer into a model's context and the sweep's
caps. Token counts are estimated from characters with a ratio the server corrects: it starts at
a measured prior (PRIOR_CHARS_PER_TOKEN), is set by the server's own tokenizer where it offers
one (llama.cpp, llama-cpp-python) before the first ask, and then follows the prompt tokens each
reply reports. A context that refuses a prompt teaches the meter both the real context and a
lower ratio; MARGIN covers what is left of the error.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import httpx
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
from agent.core.diff import lines_with_ends
from agent.core.errors import AdmissionError, ConfigError, OvernightError
from agent.rules.categories import CATEGORY_VALUES

# --- profiles: [profiles.<name>] in a TOML file; keys only from the environment ---------------
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


# --- the structured answer: the JSON edit, asked for and read back ----------------------------
TOOL_NAME = "propose_experiment"
OPENAI_AUTO = ("json_schema", "json_object", "tools", "text")  # tried in this order
ANTHROPIC_AUTO = ("tools", "text")
MAX_EDITS = 3
DESCRIPTION_CHARS = 160
REPLACE_CHARS = 600
ENUM_MAX_LINES = 600  # beyond this the search line is free text (grammars and APIs have limits)
ENUM_MAX_CHARS = 40_000
_FENCED_JSON = re.compile(r"^\s*```(?:json)?\s*\n(.*?)\n```\s*$", re.S)


def search_lines(files: dict[str, str]) -> list[str]:
    """The lines that occur exactly once in their file (trailing whitespace dropped), less
    those with a double quote or a backslash: llama-cpp-python 0.3.36 turns such an enum value
    into a grammar it cannot parse, and its server dies of it."""
    out: list[str] = []
    for _, text in sorted(files.items()):
        lines = [ln.rstrip() for ln in text.splitlines()]
        counts: dict[str, int] = {}
        for ln in lines:
            counts[ln] = counts.get(ln, 0) + 1
        out += [ln for ln in lines if ln.strip() and counts[ln] == 1 and ln not in out
                and '"' not in ln and "\\" not in ln]
    return out


def edit_schema(files: dict[str, str]) -> dict[str, Any]:
    """The JSON schema of one proposal against these files."""
    lines = search_lines(files)
    search: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 2000,
                              "description": "the exact existing line(s) to replace"}
    if lines and len(lines) <= ENUM_MAX_LINES and sum(map(len, lines)) <= ENUM_MAX_CHARS:
        search = {"type": "string", "enum": lines,
                  "description": "one existing line of the file, copied exactly"}
    edit = {"type": "object", "additionalProperties": False,
            "required": ["path", "search", "replace"],
            "properties": {"path": {"type": "string", "enum": sorted(files)},
                           "search": search,
                           "replace": {"type": "string", "maxLength": REPLACE_CHARS,
                                       "description": "the new text for those lines"}}}
    return {"type": "object", "additionalProperties": False,
            "required": ["description", "category", "edits"],
            "properties": {
                "description": {"type": "string", "minLength": 3,
                                "maxLength": DESCRIPTION_CHARS,
                                "description": "one line: what changes and why"},
                "category": {"type": "string", "enum": list(CATEGORY_VALUES)},
                "edits": {"type": "array", "minItems": 1, "maxItems": MAX_EDITS,
                          "items": edit}}}


def ask_body(answer_format: str, schema: dict[str, Any] | None) -> dict[str, Any]:
    """The chat-completions request keys that ask for the JSON edit in `answer_format`."""
    if schema is None or answer_format == "text":
        return {}
    if answer_format == "json_schema":
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "experiment", "schema": schema}}}
    if answer_format == "json_object":
        return {"response_format": {"type": "json_object", "schema": schema}}
    return {"tools": [{"type": "function", "function": {
                "name": TOOL_NAME, "description": "Propose one experiment.",
                "parameters": schema}}],
            "tool_choice": {"type": "function", "function": {"name": TOOL_NAME}}}


def read_choice(choice: dict[str, Any]) -> str:
    """A chat completion's answer text: a forced tool call's arguments, else the content."""
    message = choice["message"]
    calls = message.get("tool_calls") or []
    if calls and calls[0].get("function", {}).get("arguments"):
        args = calls[0]["function"]["arguments"]
        return args if isinstance(args, str) else json.dumps(args)
    return str(message.get("content") or "")


def read_tool_use(blocks: list[dict[str, Any]]) -> str:
    """An Anthropic answer: the forced tool's input as JSON, else the text blocks."""
    for block in blocks:
        if block.get("type") == "tool_use" and isinstance(block.get("input"), dict):
            return json.dumps(block["input"])
    return "".join(b.get("text", "") for b in blocks if b.get("type") == "text")


def json_answer(text: str) -> dict[str, Any] | None:
    """The answer's JSON object (bare or in one fenced block; text after it is ignored: a
    grammar-bound server was seen to run on past the object), None when it is not one."""
    raw = text.strip()
    m = _FENCED_JSON.match(raw)
    raw = m.group(1) if m else raw
    if not raw.startswith("{"):
        return None
    try:
        data, _ = json.JSONDecoder(strict=False).raw_decode(raw)  # raw newlines in strings
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def apply_edits(data: dict[str, Any], files: dict[str, str]) -> dict[str, str]:
    """The files after the JSON answer's edits, each found in the files as shown (so two
    edits cannot step on each other; an edit repeated counts once, two different edits of one
    line are refused). Raises AdmissionError naming the bad edit."""
    edits = data.get("edits")
    if not isinstance(edits, list) or not edits:
        raise AdmissionError("bad_edit", "the JSON answer has no 'edits' list: give at least "
                             "one {path, search, replace}")
    placed: dict[str, list[tuple[int, int, str, int]]] = {}
    seen: list[Any] = []
    for n, edit in enumerate(edits[:MAX_EDITS], 1):
        if edit in seen:  # the same edit twice (small models do) is that edit once
            continue
        seen.append(edit)
        if not isinstance(edit, dict) or not all(isinstance(edit.get(k), str)
                                                 for k in ("search", "replace")):
            raise AdmissionError("bad_edit", f"edit {n} needs string 'search' and 'replace'")
        path = edit.get("path") if edit.get("path") in files else (
            next(iter(files)) if len(files) == 1 else None)
        if path is None:
            raise AdmissionError("not_editable", f"edit {n}: {edit.get('path')!r} is not "
                                 f"editable (editable: {', '.join(sorted(files))})")
        at, count = _find(files[path], edit["search"], path, n)
        for other_at, other_count, _, m in placed.get(path, []):
            if at < other_at + other_count and other_at < at + count:
                raise AdmissionError("bad_edit", f"edits {m} and {n} change the same line of "
                                     f"{path}: give each line one edit")
        placed.setdefault(path, []).append((at, count, edit["replace"], n))
    out = dict(files)
    for path, spots in placed.items():
        lines = lines_with_ends(files[path])
        for at, count, replace, _ in sorted(spots, reverse=True):  # bottom up: indexes hold
            lines[at:at + count] = _new_lines(lines[at], replace)
        out[path] = "".join(lines)
    return out


def _find(content: str, search: str, path: str, n: int) -> tuple[int, int]:
    """Where `search` (whole lines, trailing whitespace forgiven) is in content, exactly once."""
    want = [s.rstrip() for s in search.strip("\n").split("\n")]
    lines = lines_with_ends(content)
    hits = [i for i in range(len(lines) - len(want) + 1)
            if [x.rstrip() for x in lines[i:i + len(want)]] == want]
    if len(hits) != 1:
        where = "was not found" if not hits else f"matches {len(hits)} places"
        raise AdmissionError("bad_search", f"edit {n}: the search text {want[0][:80]!r} {where} "
                             f"in {path}; copy one existing line exactly")
    return hits[0], len(want)


def _new_lines(first: str, replace: str) -> list[str]:
    """The replacement lines, indented like the line they replace when the model left the
    indentation out."""
    indent = first[:len(first) - len(first.lstrip())]
    new = replace.strip("\n").split("\n") if replace.strip() else []
    if indent and new and not new[0][:1].isspace():
        new = [indent + ln if ln.strip() else ln for ln in new]
    return [ln + "\n" for ln in new]


# --- the token budget: a prompt and its answer fitted to the context --------------------------
# Characters per token of what this proposer sends, measured with SmolLM2's tokenizer
# (benchmarks/llm_tokens.py): 2.4-2.9 on train.py-style code, 3.0 on the gpt target's first ask,
# 3.4-4.2 on prose. The prior serves only until the server's tokenizer or its first reply says.
PRIOR_CHARS_PER_TOKEN = 3.0
MESSAGE_OVERHEAD_TOKENS = 8  # a chat template's role markers, per message
MARGIN = 0.03  # of the context, for the estimate's error
MARGIN_MIN_TOKENS = 64
OUTPUT_FLOOR_TOKENS = 256  # a structured one-edit answer fits; less is not worth asking
OUTPUT_SHARE = 0.25  # of the context reserved for the answer before the history is sized
SHRINK = 0.85  # the ratio after a prompt the context refused
_CONTEXT_IN_ERROR = (
    re.compile(r"maximum context length is (\d+)", re.I),
    re.compile(r"context (?:window|size|length) of (\d+)", re.I),
    re.compile(r'"n_ctx"\s*:\s*(\d+)'),
)


class ContextFull(Exception):  # noqa: N818  (a condition, raised and caught in one module)
    """What must be shown (system, files, instructions) does not fit the model's context."""


@dataclass
class TokenMeter:
    """chars -> tokens, corrected by what the server counts."""

    chars_per_token: float = PRIOR_CHARS_PER_TOKEN
    observed: int = 0  # replies that reported their prompt tokens

    def tokens(self, text: str) -> int:
        return max(1, math.ceil(len(text) / self.chars_per_token))

    def messages(self, system: str, messages: list[dict[str, str]]) -> int:
        chars = len(system) + sum(len(m["content"]) for m in messages)
        overhead = MESSAGE_OVERHEAD_TOKENS * (len(messages) + 1)
        return max(1, math.ceil(chars / self.chars_per_token)) + overhead

    def observe(self, system: str, messages: list[dict[str, str]], prompt_tokens: int) -> None:
        """Learn the ratio from a reply's reported prompt tokens (the template's overhead out)."""
        chars = len(system) + sum(len(m["content"]) for m in messages)
        text_tokens = prompt_tokens - MESSAGE_OVERHEAD_TOKENS * (len(messages) + 1)
        if chars >= 200 and text_tokens > 0:
            self.chars_per_token = chars / text_tokens
            self.observed += 1

    def calibrate(self, text: str, tokens: int) -> None:
        """Set the ratio from a tokenizer's count of `text`."""
        if len(text) >= 200 and tokens > 0:
            self.chars_per_token = len(text) / tokens
            self.observed += 1

    def refused(self) -> None:
        """The server refused a prompt as too long: our ratio was too high."""
        self.chars_per_token *= SHRINK


def context_in_error(message: str) -> int | None:
    """The context size a length error names ("maximum context length is 8192 tokens")."""
    for pattern in _CONTEXT_IN_ERROR:
        m = pattern.search(message)
        if m:
            return int(m.group(1))
    return None


def margin(context: int) -> int:
    return max(MARGIN_MIN_TOKENS, int(context * MARGIN))


def history_budget(context: int | None, fixed_tokens: int, history_tokens: int,
                   max_output: int) -> int:
    """Tokens left for the digest and the results table once the fixed part and an answer
    fit. Raises ContextFull when the fixed part leaves no room for even a short answer."""
    if context is None:
        return history_tokens
    room = context - margin(context) - fixed_tokens
    if room < OUTPUT_FLOOR_TOKENS:
        raise ContextFull(f"the editable files and instructions need about {fixed_tokens} "
                          f"tokens; the model's context of {context} tokens leaves no room "
                          f"for an answer (use a model with a larger context)")
    reserve = min(max_output, max(OUTPUT_FLOOR_TOKENS, int(context * OUTPUT_SHARE)))
    return max(0, min(history_tokens, room - reserve))


def output_budget(context: int | None, prompt_tokens: int, max_output: int) -> int:
    """max_tokens for a request: what the context leaves after the prompt, at most max_output
    (0 when not even OUTPUT_FLOOR_TOKENS is left: do not ask)."""
    if context is None:
        return max_output
    left = min(max_output, context - margin(context) - prompt_tokens)
    return left if left >= min(OUTPUT_FLOOR_TOKENS, max_output) else 0


# --- chat backends over HTTP ------------------------------------------------------------------
logger = logging.getLogger(__name__)
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
ANTHROPIC_VERSION = "2023-06-01"
ErrorKind = Literal["length", "format", "timeout", "transient", "fatal"]
_LENGTH = re.compile(r"context[_ ]length|context (window|size)|maximum context|too long|"
                     r"exceeds? (the )?(available )?context|prompt is too long", re.I)
_FORMAT = re.compile(r"response_format|json_schema|json_object|tool_choice|\btools?\b|grammar|"
                     r"schema", re.I)
# A validation error naming the request's format keys (llama-cpp-python answers it with a 500)
_FORMAT_500 = re.compile(r"validation error.{0,200}(response_format|tool_choice|'tools')",
                         re.I | re.S)


class LLMError(OvernightError):
    """The model could not be asked (HTTP error, bad response, timeout, retries exhausted).

    `kind`: "length" (the prompt does not fit the context), "format" (the server refuses the
    answer format asked for), "timeout" (not retried), "transient" (retries exhausted on
    429/5xx/connection errors) or "fatal" (anything else: a bad key, an unknown model).
    """

    def __init__(self, message: str, kind: ErrorKind = "fatal", retries: int = 0) -> None:
        super().__init__(message)
        self.kind, self.retries = kind, retries


@dataclass(frozen=True)
class ChatRequest:
    system: str
    messages: list[dict[str, str]]  # alternate user/assistant, ending with user
    max_tokens: int
    answer_format: str = "text"  # json_schema | json_object | tools | text
    schema: dict[str, Any] | None = None  # the JSON edit's schema (any format but text)


@dataclass(frozen=True)
class ChatReply:
    text: str
    tokens_in: int
    tokens_out: int
    retries: int = 0  # HTTP retries spent on this call
    finish: str = ""  # the server's finish/stop reason ("stop", "length", "tool_calls" ...)
    reported: bool = True  # the server reported the token counts (else estimated)
    seconds: float = 0.0


class ChatBackend(Protocol):
    def complete(self, request: ChatRequest) -> ChatReply:
        """One chat turn.

        Raises:
            LLMError: when no usable reply came back within the retries (see its `kind`).
        """

    def context_tokens(self) -> int | None:
        """The model's context size where the server says (None where it does not)."""

    def count_tokens(self, text: str) -> int | None:
        """`text`'s tokens by the server's own tokenizer, where it has one (else None)."""


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 3)


class HttpChat:
    """Shared retry loop; subclasses build the request and read the reply."""

    path = ""

    def __init__(self, profile: LLMProfile, *, client: httpx.Client | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.profile = profile
        self._key = profile.api_key()
        self._client = client or httpx.Client(timeout=httpx.Timeout(profile.timeout_s, connect=15))
        self._sleep = sleep

    def headers(self) -> dict[str, str]:
        raise NotImplementedError

    def body(self, request: ChatRequest) -> dict[str, Any]:
        raise NotImplementedError

    def read(self, data: dict[str, Any]) -> tuple[str, int | None, int | None, str]:
        raise NotImplementedError

    def context_tokens(self) -> int | None:
        return None

    def count_tokens(self, text: str) -> int | None:
        return None

    def complete(self, request: ChatRequest) -> ChatReply:
        url = self.profile.base_url + self.path
        body = {**self.body(request), **self.profile.extra_body}
        for key in self.profile.omit:
            body.pop(key, None)
        # Its own loop, not agent.core.retry or tenacity: each answer sets the wait (Retry-After)
        # and its kind decides the retry (a timeout never is); httpx retries connections only.
        retries, start = 0, time.monotonic()
        while True:
            problem = self._post(url, body, request)
            if isinstance(problem, httpx.Response):
                return self._reply(problem, request, retries, time.monotonic() - start)
            kind, message, wait = problem
            if kind != "transient" or retries >= self.profile.max_retries:
                suffix = f" after {retries} retries" if retries else ""
                raise LLMError(f"{self.profile.backend} {self.profile.model}: {message}{suffix}",
                               kind, retries)
            delay = wait if wait is not None else self.profile.backoff_s * 2 ** retries
            delay = min(delay, self.profile.max_backoff_s) * (1 + random.random() * 0.1)
            logger.warning("LLM call failed (%s); retry %d in %.1fs", message, retries + 1, delay)
            self._sleep(delay)
            retries += 1

    def _post(self, url: str, body: dict[str, Any], request: ChatRequest
              ) -> httpx.Response | tuple[ErrorKind, str, float | None]:
        try:
            resp = self._client.post(url, json=body, headers=self.headers())
        except httpx.TimeoutException:
            return "timeout", (f"no answer within timeout_s={self.profile.timeout_s:g} "
                               "(not asked again: the server may still be generating)"), None
        except httpx.TransportError as exc:
            return "transient", f"connection error: {exc.__class__.__name__}: {exc}", None
        if resp.status_code < 400:
            return resp
        detail = resp.text[:300].replace("\n", " ")
        message = f"HTTP {resp.status_code} from {url}: {detail}"
        code, text = resp.status_code, resp.text
        if request.answer_format != "text" and (
                (code in (400, 422) and _FORMAT.search(text))
                or (code == 500 and _FORMAT_500.search(text))):  # llama-cpp-python's 500
            return "format", message, None
        if code in RETRY_STATUSES:
            return "transient", message, _retry_after(resp)
        if code in (400, 413, 422) and _LENGTH.search(text):
            return "length", message, None
        return "fatal", message, None

    def _reply(self, resp: httpx.Response, request: ChatRequest, retries: int,
               seconds: float) -> ChatReply:
        try:
            text, tin, tout, finish = self.read(resp.json())
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise LLMError(f"{self.profile.backend}: unreadable response ({exc!r}): "
                           f"{resp.text[:200]}") from None
        prompt = request.system + "".join(m["content"] for m in request.messages)
        return ChatReply(text=text or "",
                         tokens_in=tin if tin is not None else _estimate_tokens(prompt),
                         tokens_out=tout if tout is not None else _estimate_tokens(text or ""),
                         retries=retries, finish=finish,
                         reported=tin is not None and tout is not None, seconds=seconds)


def _retry_after(resp: httpx.Response) -> float | None:
    raw = resp.headers.get("retry-after")
    try:
        return max(0.0, float(raw)) if raw is not None else None
    except ValueError:
        return None


class OpenAIChat(HttpChat):
    """Any OpenAI-compatible /chat/completions endpoint (OpenAI, vLLM, llama.cpp, Ollama...)."""

    path = "/chat/completions"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._key}"} if self._key else {}

    def body(self, request: ChatRequest) -> dict[str, Any]:
        return {"model": self.profile.model, "temperature": self.profile.temperature,
                "max_tokens": request.max_tokens,
                "messages": [{"role": "system", "content": request.system}, *request.messages],
                **ask_body(request.answer_format, request.schema)}

    def read(self, data: dict[str, Any]) -> tuple[str, int | None, int | None, str]:
        choice = data["choices"][0]
        usage = data.get("usage") or {}
        return (read_choice(choice), usage.get("prompt_tokens"), usage.get("completion_tokens"),
                str(choice.get("finish_reason") or ""))

    def context_tokens(self) -> int | None:
        """vLLM and others name it in /models; llama.cpp's server in /props."""
        root = self.profile.base_url.removesuffix("/v1")
        for url, find in ((self.profile.base_url + "/models", _context_in_models),
                          (root + "/props", _context_in_props)):
            try:
                resp = self._client.get(url, headers=self.headers(), timeout=10)
                found = find(resp.json()) if resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError, TypeError, AttributeError):
                found = None
            if found:
                return found
        return None


    def count_tokens(self, text: str) -> int | None:
        """llama-cpp-python's /extras/tokenize/count, llama.cpp's /tokenize."""
        root = self.profile.base_url.removesuffix("/v1")
        for url, body, read in ((root + "/extras/tokenize/count", {"input": text},
                                 lambda d: d.get("count")),
                                (root + "/tokenize", {"content": text},
                                 lambda d: len(d.get("tokens") or []) or None)):
            try:
                resp = self._client.post(url, json=body, headers=self.headers(), timeout=30)
                found = read(resp.json()) if resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError, TypeError, AttributeError):
                found = None
            if isinstance(found, int) and found > 0:
                return found
        return None


def _context_in_models(data: Any) -> int | None:
    for model in data.get("data") or []:
        meta = model.get("meta") or {}
        for value in (model.get("max_model_len"), model.get("context_length"),
                      model.get("context_window"), meta.get("n_ctx"), meta.get("n_ctx_train")):
            if isinstance(value, int) and value > 0:
                return value
    return None


def _context_in_props(data: Any) -> int | None:
    settings = data.get("default_generation_settings") or {}
    value = settings.get("n_ctx", data.get("n_ctx"))
    return value if isinstance(value, int) and value > 0 else None


class AnthropicChat(HttpChat):
    """The Anthropic Messages API (/v1/messages); a JSON edit comes as a forced tool call."""

    path = "/v1/messages"

    def headers(self) -> dict[str, str]:
        head = {"anthropic-version": ANTHROPIC_VERSION}
        if self._key:
            head["x-api-key"] = self._key
        return head

    def body(self, request: ChatRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.profile.model,
                                "temperature": self.profile.temperature,
                                "max_tokens": request.max_tokens, "system": request.system,
                                "messages": request.messages}
        if request.answer_format != "text" and request.schema is not None:
            body["tools"] = [{"name": TOOL_NAME, "description": "Propose one experiment.",
                              "input_schema": request.schema}]
            body["tool_choice"] = {"type": "tool", "name": TOOL_NAME}
        return body

    def read(self, data: dict[str, Any]) -> tuple[str, int | None, int | None, str]:
        text = read_tool_use(data["content"])
        usage = data.get("usage") or {}
        return (text, usage.get("input_tokens"), usage.get("output_tokens"),
                str(data.get("stop_reason") or ""))


def make_backend(profile: LLMProfile, **kwargs: Any) -> ChatBackend:
    cls = AnthropicChat if profile.backend == "anthropic" else OpenAIChat
    return cls(profile, **kwargs)
