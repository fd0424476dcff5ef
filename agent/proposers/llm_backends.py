"""Chat backends over plain HTTP (httpx): OpenAI-compatible chat completions, Anthropic messages.

Bounded retries with exponential backoff (and Retry-After) on 429, 5xx and transport errors;
any other HTTP error fails at once. Keys travel only in request headers and never appear in
an error message or a log line.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from agent.core.errors import OvernightError
from agent.proposers.llm_config import LLMProfile

logger = logging.getLogger(__name__)
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
ANTHROPIC_VERSION = "2023-06-01"


class LLMError(OvernightError):
    """The model could not be asked (HTTP error, bad response, retries exhausted)."""


@dataclass(frozen=True)
class ChatReply:
    text: str
    tokens_in: int
    tokens_out: int
    retries: int = 0  # HTTP retries spent on this call


class ChatBackend(Protocol):
    def complete(self, system: str, messages: list[dict[str, str]]) -> ChatReply:
        """One chat turn. `messages` alternate user/assistant, ending with user.

        Raises:
            LLMError: when no usable reply came back within the retries.
        """


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


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

    def body(self, system: str, messages: list[dict[str, str]]) -> dict[str, Any]:
        raise NotImplementedError

    def read(self, data: dict[str, Any]) -> tuple[str, int | None, int | None]:
        raise NotImplementedError

    def complete(self, system: str, messages: list[dict[str, str]]) -> ChatReply:
        url = self.profile.base_url + self.path
        body = {**self.body(system, messages), **self.profile.extra_body}
        for key in self.profile.omit:
            body.pop(key, None)
        retries = 0
        while True:
            problem = self._post(url, body)
            if isinstance(problem, httpx.Response):
                return self._reply(problem, system, messages, retries)
            retryable, message, wait = problem
            if not retryable or retries >= self.profile.max_retries:
                suffix = f" after {retries} retries" if retries else ""
                raise LLMError(f"{self.profile.backend} {self.profile.model}: {message}{suffix}")
            delay = wait if wait is not None else self.profile.backoff_s * 2 ** retries
            delay = min(delay, self.profile.max_backoff_s) * (1 + random.random() * 0.1)
            logger.warning("LLM call failed (%s); retry %d in %.1fs", message, retries + 1, delay)
            self._sleep(delay)
            retries += 1

    def _post(self, url: str, body: dict[str, Any]
              ) -> httpx.Response | tuple[bool, str, float | None]:
        try:
            resp = self._client.post(url, json=body, headers=self.headers())
        except httpx.TimeoutException:
            return True, f"timed out after {self.profile.timeout_s:g}s", None
        except httpx.TransportError as exc:
            return True, f"connection error: {exc.__class__.__name__}: {exc}", None
        if resp.status_code < 400:
            return resp
        detail = resp.text[:300].replace("\n", " ")
        message = f"HTTP {resp.status_code} from {url}: {detail}"
        return resp.status_code in RETRY_STATUSES, message, _retry_after(resp)

    def _reply(self, resp: httpx.Response, system: str, messages: list[dict[str, str]],
               retries: int) -> ChatReply:
        try:
            text, tin, tout = self.read(resp.json())
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise LLMError(f"{self.profile.backend}: unreadable response ({exc!r}): "
                           f"{resp.text[:200]}") from None
        prompt = system + "".join(m["content"] for m in messages)
        return ChatReply(text=text or "",
                         tokens_in=tin if tin is not None else _estimate_tokens(prompt),
                         tokens_out=tout if tout is not None else _estimate_tokens(text or ""),
                         retries=retries)


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

    def body(self, system: str, messages: list[dict[str, str]]) -> dict[str, Any]:
        return {"model": self.profile.model, "temperature": self.profile.temperature,
                "max_tokens": self.profile.max_output_tokens,
                "messages": [{"role": "system", "content": system}, *messages]}

    def read(self, data: dict[str, Any]) -> tuple[str, int | None, int | None]:
        text = data["choices"][0]["message"]["content"]
        usage = data.get("usage") or {}
        return str(text or ""), usage.get("prompt_tokens"), usage.get("completion_tokens")


class AnthropicChat(HttpChat):
    """The Anthropic Messages API (/v1/messages)."""

    path = "/v1/messages"

    def headers(self) -> dict[str, str]:
        head = {"anthropic-version": ANTHROPIC_VERSION}
        if self._key:
            head["x-api-key"] = self._key
        return head

    def body(self, system: str, messages: list[dict[str, str]]) -> dict[str, Any]:
        return {"model": self.profile.model, "temperature": self.profile.temperature,
                "max_tokens": self.profile.max_output_tokens, "system": system,
                "messages": messages}

    def read(self, data: dict[str, Any]) -> tuple[str, int | None, int | None]:
        text = "".join(b.get("text", "") for b in data["content"] if b.get("type") == "text")
        usage = data.get("usage") or {}
        return text, usage.get("input_tokens"), usage.get("output_tokens")


def make_backend(profile: LLMProfile, **kwargs: Any) -> ChatBackend:
    cls = AnthropicChat if profile.backend == "anthropic" else OpenAIChat
    return cls(profile, **kwargs)
