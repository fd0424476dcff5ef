"""Chat backends over plain HTTP (httpx): OpenAI-compatible chat completions, Anthropic messages.

Bounded retries with exponential backoff (and Retry-After) on 429, 5xx and connection errors;
never after a timeout (the server may still be generating the abandoned request: asking again
would double its load). Any other HTTP error fails at once, classified (`LLMError.kind`) so the
proposer can tell a prompt too long for the context, an answer format the server refuses, a
timeout and a transient outage from a fatal error. Keys travel only in request headers and
never appear in an error message or a log line.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import httpx

from agent.core.errors import OvernightError
from agent.proposers.llm_config import LLMProfile
from agent.proposers.llm_formats import TOOL_NAME, ask_body, read_choice, read_tool_use

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
