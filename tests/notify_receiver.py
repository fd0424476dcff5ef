"""A real HTTP receiver on loopback for the notification tests: it records every POST (path,
headers, body), can answer a status for the first N requests, or hold requests until released."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    url: str
    got: list[Received] = field(default_factory=list)
    fail_first: int = 0  # answer `fail_status` to this many requests first
    fail_status: int = 503
    hold: threading.Event | None = None  # set: requests wait for it before answering
    seen: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, predicate, timeout_s: float = 60.0) -> list[Received]:  # type: ignore[no-untyped-def]
        """Wait until `predicate(got)` holds (a state, not a duration; the bound is a guard)."""
        deadline = time.monotonic() + timeout_s
        with self.arrived:
            while not predicate(list(self.got)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"receiver: still waiting; got {self.events()}")
                self.arrived.wait(left)
            return list(self.got)

    def events(self) -> list[tuple[str, str]]:
        """(path, event) of each JSON event received, in order."""
        out = []
        for r in self.got:
            try:
                out.append((r.path, r.json().get("event", "")))
            except (ValueError, AttributeError):
                out.append((r.path, r.headers.get("Title", "")))
        return out


@contextmanager
def receiver(**options: Any) -> Iterator[Receiver]:
    state = Receiver("", **options)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with state.lock:
                state.seen += 1
                failing = state.seen <= state.fail_first
            if state.hold is not None:
                state.hold.wait(120)
            if failing:
                self.send_response(state.fail_status)
                self.end_headers()
                return
            with state.arrived:
                state.got.append(Received(self.path, dict(self.headers), body))
                state.arrived.notify_all()
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        if state.hold is not None:
            state.hold.set()
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
