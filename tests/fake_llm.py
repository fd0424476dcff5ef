"""Fake OpenAI-compatible and Anthropic servers: real HTTP on loopback, scripted answers.

Each request pops the next scripted step: a string (the model's answer), a `Tool(arguments)`
(a forced tool call's answer), an `Error(status)` (an HTTP error, e.g. 429), a `Slow(seconds,
step)` (answered that much later: a request the client gives up on), or a callable taking the
request JSON and returning one of those. Every chat request (path, headers, JSON body) is kept
in `requests` for assertions; other paths (a tokenizer endpoint) answer 404.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Error:
    status: int
    body: str = '{"error": {"message": "rate limited"}}'
    retry_after: float | None = None


@dataclass(frozen=True)
class Tool:
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Slow:
    seconds: float
    then: str | Tool | Error


Step = str | Tool | Error | Slow | Callable[[dict[str, Any]], "str | Tool | Error"]


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def last_user(self) -> str:
        return str(self.body["messages"][-1]["content"])


@dataclass
class FakeLLM:
    kind: str  # "openai" | "anthropic"
    script: list[Step]
    tokens_in: int = 1000
    tokens_out: int = 200
    requests: list[Seen] = field(default_factory=list)
    exhausted_answer: str = "I have no further ideas."

    def __post_init__(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.endswith(("/chat/completions", "/v1/messages")):
                    self._send(404, b'{"error": "not found"}')  # e.g. a tokenizer endpoint
                    return
                fake.requests.append(Seen(self.path, {k.lower(): v for k, v in
                                                      self.headers.items()}, body))
                step: Any = fake.script.pop(0) if fake.script else fake.exhausted_answer
                if callable(step):
                    step = step(body)
                if isinstance(step, Slow):
                    time.sleep(step.seconds)
                    step = step.then
                try:
                    if isinstance(step, Error):
                        self._send(step.status, step.body.encode(), step.retry_after)
                        return
                    self._send(200, json.dumps(fake.reply(step)).encode())
                except OSError:
                    pass  # the client gave up waiting

            def _send(self, status: int, data: bytes, retry_after: float | None = None) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                if retry_after is not None:
                    self.send_header("retry-after", f"{retry_after:g}")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def reply(self, answer: str | Tool) -> dict[str, Any]:
        if self.kind == "anthropic":
            block = ({"type": "tool_use", "id": "toolu_fake", "name": "propose_experiment",
                      "input": answer.arguments} if isinstance(answer, Tool) else
                     {"type": "text", "text": answer})
            return {"id": "msg_fake", "type": "message", "role": "assistant",
                    "content": [block], "model": "fake",
                    "stop_reason": "tool_use" if isinstance(answer, Tool) else "end_turn",
                    "usage": {"input_tokens": self.tokens_in, "output_tokens": self.tokens_out}}
        message: dict[str, Any] = {"role": "assistant", "content": answer}
        if isinstance(answer, Tool):
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_fake", "type": "function", "function": {
                    "name": "propose_experiment", "arguments": json.dumps(answer.arguments)}}]}
        return {"id": "chatcmpl-fake", "object": "chat.completion", "model": "fake",
                "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                "usage": {"prompt_tokens": self.tokens_in, "completion_tokens": self.tokens_out,
                          "total_tokens": self.tokens_in + self.tokens_out}}

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        root = f"http://{host}:{port}"
        return root + "/v1" if self.kind == "openai" else root

    def __enter__(self) -> FakeLLM:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
