"""Notifications: when to notify, where to, and the delivery over HTTP.

When (pure state, no I/O): a keep, a crash streak, a plateau, a paused sweep and the end of the
night, read off the engine's finished experiments and the sweeps' statuses. `Watch.finished`
and `Watch.status` take what happened and return the notices it calls for, each at most once
per occurrence (a streak is announced when it reaches its length, a plateau when it sets in;
both again only after a keep or a run that ends them).

Where: `--notify URL` values and the `[[notify]]` tables of a notify file (default
~/.overnight/notify.toml), checked, with each URL's format (json, slack, ntfy) and the events it
wants; and `redact`, the only form of a URL that is ever logged or printed. A URL's format is
named by a prefix (`slack+https://…`, `ntfy+https://…`, `json+https://…`) or the file's `format`
key, else read off the host (hooks.slack.com: slack; a host with "ntfy" in it: ntfy; anything
else: overnight's JSON event). Bad input is one ConfigError naming it (the URL redacted).

Delivery: each notice POSTed to every URL that asked for its event, as overnight's JSON event,
a Slack incoming-webhook body or an ntfy message, with the sweep's report headline. Never
blocks the engine: `on_event` (the engine's event callback) only puts a finished experiment on
a bounded queue; a full queue drops it, and says so once. One worker thread reads the queue,
polls the sweeps' statuses every `poll_s` (a pause or the end of the night) and works out the
headline; each URL has its own Outbox (a bounded queue and a thread), so a dead receiver delays
only itself. A POST is retried with exponential backoff (agent.core.retry) on a transport
error, a timeout, 408, 425, 429 or 5xx; `close` waits a bounded time for what is queued. A URL's
secret never reaches a log: only its scheme and host are written (`redact`), and a failing URL
is logged once until it works again. HTTP through the standard library (urllib).
"""

from __future__ import annotations

import base64
import json
import logging
import queue
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from agent.analysis.ablation import ablated_sweep
from agent.analysis.confirm import confirmed_sweep
from agent.analysis.report import comparison_line
from agent.analysis.trials import PLATEAU_AFTER
from agent.core.domain import Experiment, ExperimentStatus, Sweep, SweepStatus, utcnow
from agent.core.errors import ConfigError
from agent.core.ports import Store
from agent.core.retry import retry

# --- when to notify ---------------------------------------------------------------------------
S = ExperimentStatus
KEEP, CRASH_STREAK, PLATEAU, PAUSED, DONE = "keep", "crash_streak", "plateau", "paused", "done"
EVENTS = (KEEP, CRASH_STREAK, PLATEAU, PAUSED, DONE)
CRASH_STREAK_DEFAULT = 3


@dataclass(frozen=True)
class Notice:
    """One thing worth a message: what happened, to which sweep, in a title and a line."""

    event: str
    sweep: str
    title: str
    text: str
    experiment: dict[str, Any] | None = None
    status: str = ""  # the sweep's status when it was noticed


@dataclass
class _State:
    streak: list[Experiment] = field(default_factory=list)  # crashes in a row
    stall: int = 0  # runs since the last keep
    last_keep: int | None = None
    status: SweepStatus | None = None


def _brief(e: Experiment) -> dict[str, Any]:
    return {"id": e.id, "description": e.description, "status": e.status.value,
            "metric": e.metric, "delta": e.delta, "crash_kind":
            e.crash_kind.value if e.crash_kind else None, "crash_cause": e.crash_cause}


class Watch:
    def __init__(self, crash_streak: int = CRASH_STREAK_DEFAULT,
                 plateau_after: int = PLATEAU_AFTER) -> None:
        self.crash_streak, self.plateau_after = crash_streak, plateau_after
        self.sweeps: dict[str, _State] = {}

    def knows(self, name: str) -> bool:
        return name in self.sweeps

    def seed(self, sweep: Sweep, history: Iterable[Experiment]) -> None:
        """Start following `sweep` where its history (finished experiments) left it."""
        state = self.sweeps.setdefault(sweep.name, _State(status=sweep.status))
        for e in history:
            self._count(state, e)

    def finished(self, sweep: Sweep, e: Experiment) -> list[Notice]:
        state = self.sweeps.setdefault(sweep.name, _State(status=sweep.status))
        if ablated_sweep(sweep.proposer) is not None or \
                confirmed_sweep(sweep.proposer) is not None:
            return []  # an ablation measures, keeps nothing: only its end is news
        before_streak, before_stall = len(state.streak), state.stall
        if not self._count(state, e):
            return []
        if e.status is S.KEPT:
            compared = comparison_line(e, sweep.direction, sweep.config.time_budget)
            what = f"{sweep.metric} {compared or 'kept'}"
            return [Notice(KEEP, sweep.name, f"{sweep.name}: kept #{e.id} {e.description[:80]}",
                           what, _brief(e), sweep.status.value)]
        out = []
        if len(state.streak) == self.crash_streak > before_streak:
            causes = ", ".join(f"#{x.id} {x.crash_cause or x.status.value}"
                               for x in state.streak)
            out.append(Notice(CRASH_STREAK, sweep.name,
                              f"{sweep.name}: {self.crash_streak} crashes in a row",
                              causes, _brief(e), sweep.status.value))
        if state.stall == self.plateau_after > before_stall:
            last = f"last keep #{state.last_keep}" if state.last_keep else "nothing kept yet"
            out.append(Notice(PLATEAU, sweep.name, f"{sweep.name}: on a plateau",
                              f"{state.stall} runs without a keep ({last})", _brief(e),
                              sweep.status.value))
        return out

    def _count(self, state: _State, e: Experiment) -> bool:
        """Fold one finished experiment in; False when it says nothing (the baseline, a
        refusal, a cancel)."""
        if e.is_baseline or e.status not in (S.KEPT, S.DISCARDED, S.CRASHED, S.TIMEOUT):
            return False
        if e.status is S.KEPT:
            state.streak, state.stall, state.last_keep = [], 0, e.id
            return True
        state.stall += 1
        state.streak = [*state.streak, e] if e.status in (S.CRASHED, S.TIMEOUT) else []
        return True

    def status(self, sweep: Sweep) -> list[Notice]:
        """A sweep's status as read now: a notice when it just paused or ended."""
        state = self.sweeps.setdefault(sweep.name, _State())
        was, state.status = state.status, sweep.status
        if was is sweep.status or was is None and sweep.status is not SweepStatus.RUNNING:
            return []
        if sweep.status is SweepStatus.PAUSED:
            return [Notice(PAUSED, sweep.name, f"{sweep.name}: paused",
                           "the sweep is paused: the service's log says why; resume it "
                           f"(POST /sweeps/{sweep.name}/resume or overnight run --resume)",
                           status=sweep.status.value)]
        if sweep.status.is_finished():
            return [Notice(DONE, sweep.name, f"{sweep.name}: the night is over "
                           f"({sweep.status.value})", f"overnight report --sweep {sweep.name}",
                           status=sweep.status.value)]
        return []


# --- where notifications go -------------------------------------------------------------------
FORMATS = ("json", "slack", "ntfy")
FILE_KEYS = {"crash_streak", "notify"}
TARGET_KEYS = {"url", "format", "events"}


def redact(url: str) -> str:
    """scheme://host[:port] and "/…" for any path: userinfo, path, query and fragment can all
    carry a secret (Slack's webhook path is the token, an ntfy topic is its password)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an unreadable URL)"
    host = f"[{host}]" if ":" in host else host
    rest = "/…" if parts.path.strip("/") or parts.query or parts.fragment else ""
    return f"{parts.scheme or '?'}://{host}{port}{rest}"


@dataclass(frozen=True)
class NotifyTarget:
    url: str
    format: str = "json"
    events: frozenset[str] = field(default_factory=lambda: frozenset(EVENTS))

    def __str__(self) -> str:  # what a log line or a listing may show
        return f"{self.format} {redact(self.url)}"


@dataclass(frozen=True)
class NotifyConfig:
    targets: list[NotifyTarget]
    crash_streak: int = CRASH_STREAK_DEFAULT


def target_of(spec: str, fmt: str | None = None,
              events: frozenset[str] | None = None) -> NotifyTarget:
    """One URL (with an optional `format+` prefix) as a target; ConfigError if it is not one."""
    spec = spec.strip()
    head, plus, rest = spec.partition("+")
    if plus and head in FORMATS and rest.startswith(("http://", "https://")):
        fmt, spec = fmt or head, rest
    try:
        parts = urlsplit(spec)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise ConfigError(f"notify: {redact(spec)} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"notify: {redact(spec)} is not an http:// or https:// URL")
    if fmt is not None and fmt not in FORMATS:
        raise ConfigError(f"notify: format {fmt!r} for {redact(spec)}: use one of "
                          f"{', '.join(FORMATS)}")
    return NotifyTarget(spec, fmt or _guess(parts.hostname), events or frozenset(EVENTS))


def _guess(host: str) -> str:
    if host == "hooks.slack.com":
        return "slack"
    return "ntfy" if "ntfy" in host else "json"


def load_notify_config(path: Path) -> NotifyConfig:
    """The notify file: `crash_streak = N` and `[[notify]]` tables (url, format, events)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = set(data) - FILE_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} (known: "
                          f"{', '.join(sorted(FILE_KEYS))})")
    streak = data.get("crash_streak", CRASH_STREAK_DEFAULT)
    if not isinstance(streak, int) or isinstance(streak, bool) or not 1 <= streak <= 100:
        raise ConfigError(f"{path}: crash_streak must be a whole number from 1 to 100")
    tables = data.get("notify", [])
    if not isinstance(tables, list):
        raise ConfigError(f"{path}: write each URL as a [[notify]] table")
    return NotifyConfig([_table(path, i, t) for i, t in enumerate(tables)], streak)


def _table(path: Path, i: int, t: Any) -> NotifyTarget:
    where = f"{path}: [[notify]] #{i + 1}"
    if not isinstance(t, dict):
        raise ConfigError(f"{where} is not a table")
    unknown = set(t) - TARGET_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    if not isinstance(t.get("url"), str):
        raise ConfigError(f"{where}: needs url = \"https://…\"")
    events = t.get("events")
    if events is not None:
        if not isinstance(events, list) or not events or any(e not in EVENTS for e in events):
            raise ConfigError(f"{where}: events must list some of {', '.join(EVENTS)}")
        events = frozenset(events)
    fmt = t.get("format")
    if fmt is not None and not isinstance(fmt, str):
        raise ConfigError(f"{where}: format must be one of {', '.join(FORMATS)}")
    try:
        return target_of(t["url"], fmt, events)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


# --- the delivery over HTTP -------------------------------------------------------------------
logger = logging.getLogger(__name__)
QUEUE_SIZE = 256
USER_AGENT = "overnight-notify/1"
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})

Post = Callable[[str, bytes, Mapping[str, str], float], int]  # → the HTTP status


class DeliveryError(Exception):
    """A POST that failed; `retry`: worth trying again."""

    def __init__(self, why: str, retry: bool) -> None:
        super().__init__(why)
        self.retry = retry


def urllib_post(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> int:
    """POST `body`; user:password in the URL becomes a Basic Authorization header (as ntfy's
    access tokens and most webhooks accept). DeliveryError for anything but a 2xx answer."""
    parts = urlsplit(url)
    sent = {"User-Agent": USER_AGENT, **headers}
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        sent["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    try:
        request = urllib.request.Request(url, data=body, method="POST", headers=sent)
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310 (http/s only)
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        raise DeliveryError(f"HTTP {exc.code}", exc.code in RETRY_STATUSES) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DeliveryError(f"{type(exc).__name__}: {reason}", True) from None
    except Exception as exc:  # noqa: BLE001 - a bad URL or answer: one readable failure
        raise DeliveryError(type(exc).__name__, False) from None


@dataclass(frozen=True)
class Event:
    """A notice ready to send: the notice, the report's headline, when."""

    notice: Notice
    headline: str
    at: datetime

    def payload(self) -> dict[str, Any]:
        n = self.notice
        return {"source": "overnight", "event": n.event, "sweep": n.sweep, "title": n.title,
                "text": n.text, "headline": self.headline, "status": n.status,
                "experiment": n.experiment, "at": self.at.isoformat(),
                "report": f"overnight report --sweep {n.sweep}"}


def body_for(target: NotifyTarget, event: Event) -> tuple[bytes, dict[str, str]]:
    """What to POST to `target`: its format's body and headers."""
    n = event.notice
    if target.format == "slack":
        text = f"*{n.title}*\n{n.text}\n{event.headline}"
        return json.dumps({"text": text}).encode(), {"Content-Type": "application/json"}
    if target.format == "ntfy":
        tags = {"keep": "white_check_mark", "crash_streak": "warning", "plateau": "zzz",
                "paused": "pause_button", "done": "sunrise"}.get(n.event, "bell")
        headers = {"Content-Type": "text/plain; charset=utf-8", "Title": _ascii(n.title),
                   "Tags": tags, "Priority": "high" if n.event == "crash_streak" else "default"}
        return f"{n.text}\n{event.headline}".encode(), headers
    return json.dumps(event.payload()).encode(), {"Content-Type": "application/json"}


def _ascii(text: str) -> str:
    """HTTP header values are Latin-1: anything else becomes '?'."""
    return text.encode("latin-1", "replace").decode("latin-1")


class Outbox:
    """One URL's deliveries: its own bounded queue and thread, so a slow or dead receiver
    delays only itself. Retries with exponential backoff; a URL that keeps failing is logged
    once (until it works again) and then tried once per event, without backoff."""

    def __init__(self, target: NotifyTarget, post: Post, *, retries: int, backoff_s: float,
                 max_backoff_s: float, timeout_s: float, queue_size: int) -> None:
        self.target, self.post = target, post
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        self.timeout_s = timeout_s
        self.queue: queue.Queue[Event | None] = queue.Queue(maxsize=queue_size)
        self.sent: list[str] = []  # the events delivered, in order
        self.failing = False
        self.dropped = 0
        self.deadline: float | None = None
        self.thread = threading.Thread(target=self._work, daemon=True,
                                       name=f"overnight-notify-{redact(target.url)}")

    def put(self, event: Event) -> None:
        try:
            self.queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                logger.warning("notifications to %s: too many waiting; later ones are dropped",
                               redact(self.target.url))

    def _work(self) -> None:
        while (event := self.queue.get()) is not None:
            self.deliver(event)

    def deliver(self, event: Event) -> bool:
        body, headers = body_for(self.target, event)
        where = redact(self.target.url)

        def failed(attempt: int, exc: Exception) -> None:
            logger.debug("notify %s: attempt %d failed: %s", where, attempt,
                         _scrub(str(exc), self.target.url))

        try:
            retry(lambda: self.post(self.target.url, body, headers, self.timeout_s),
                  tries=1 if self.failing else self.retries + 1, backoff_s=self.backoff_s,
                  max_backoff_s=self.max_backoff_s, pause=self._pause, failed=failed,
                  retryable=lambda exc: isinstance(exc, DeliveryError) and exc.retry)
        except DeliveryError as exc:
            if not self.failing:
                self.failing = True
                logger.warning("notifications to %s failed (%s); the night goes on, and "
                               "further failures of this URL are not logged until it works "
                               "again", where, _scrub(str(exc), self.target.url))
            return False
        self.sent.append(event.notice.event)
        if self.failing:
            self.failing = False
            logger.warning("notifications to %s work again", where)
        return True

    def _pause(self, seconds: float) -> bool:
        """Sleep before a retry; False when closing leaves no time for it."""
        if self.deadline is not None and self.deadline - time.monotonic() <= seconds:
            return False
        time.sleep(seconds)
        return True

    def close(self, deadline: float) -> None:
        self.deadline = deadline
        try:
            self.queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            return
        self.thread.join(max(0.0, deadline - time.monotonic()))


class Notifier:
    """The engine's queue, the watch and the thread that turns them into events, one Outbox
    per URL (see the module docstring)."""

    def __init__(self, targets: list[NotifyTarget], store: Store, *,
                 headline: Callable[[str], str], crash_streak: int = CRASH_STREAK_DEFAULT,
                 retries: int = 4, backoff_s: float = 1.0, max_backoff_s: float = 30.0,
                 timeout_s: float = 10.0, poll_s: float = 5.0, queue_size: int = QUEUE_SIZE,
                 post: Post = urllib_post) -> None:
        self.store, self.headline, self.poll_s = store, headline, poll_s
        self.outboxes = [Outbox(t, post, retries=retries, backoff_s=backoff_s,
                                max_backoff_s=max_backoff_s, timeout_s=timeout_s,
                                queue_size=queue_size) for t in targets]
        self.watch = Watch(crash_streak)
        self.queue: queue.Queue[Experiment | None] = queue.Queue(maxsize=queue_size)
        self.dropped = 0
        self._thread = threading.Thread(target=self._work, name="overnight-notify", daemon=True)

    # --- the engine's side: never blocks --------------------------------------------------
    def on_event(self, kind: str, exp: Experiment, data: dict[str, Any]) -> None:
        if kind != "finished":
            return
        try:
            self.queue.put_nowait(exp)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                logger.warning("notifications: the queue is full; events are dropped, the "
                               "night goes on")

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> Notifier:
        for s in self.store.list_sweeps([SweepStatus.RUNNING]):
            self.watch.status(s)  # known as running: its pause or end is noticed
        for box in self.outboxes:
            box.thread.start()
        self._thread.start()
        return self

    def close(self, timeout_s: float = 15.0) -> None:
        """Deliver what is queued (and the sweeps' last statuses) for at most `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        if self._thread.is_alive():
            try:
                self.queue.put(None, timeout=timeout_s)
                self._thread.join(max(0.0, deadline - time.monotonic()))
            except queue.Full:
                pass
        for box in self.outboxes:
            box.close(deadline)

    # --- the worker -----------------------------------------------------------------------
    def _work(self) -> None:
        next_poll = time.monotonic() + self.poll_s
        while True:
            item: Experiment | None | bool
            try:
                item = self.queue.get(timeout=max(0.0, next_poll - time.monotonic()))
            except queue.Empty:
                item = False  # nothing came: time to poll
            try:
                if item is None:  # closing: the last statuses, then stop
                    self._poll()
                    return
                if isinstance(item, Experiment):
                    self._finished(item)
                # Statuses once what finished before them is told (a keep before the end).
                if time.monotonic() >= next_poll and self.queue.empty():
                    self._poll()
                    next_poll = time.monotonic() + self.poll_s
            except Exception:  # noqa: BLE001 - a bad read must not end the notifications
                logger.exception("notifications: handling an event failed")

    def _finished(self, exp: Experiment) -> None:
        sweep = self.store.get_sweep_by_id(exp.sweep_id)
        if not self.watch.knows(sweep.name):
            history = [e for e in self.store.list_experiments(sweep.id)
                       if e.status.is_finished() and e.id != exp.id]
            history.sort(key=lambda e: (e.finished_at or utcnow(), e.id))
            self.watch.seed(sweep, history)
        for notice in self.watch.finished(sweep, exp):
            self._send(notice)

    def _poll(self) -> None:
        running = {s.name: s for s in self.store.list_sweeps([SweepStatus.RUNNING])}
        followed = [n for n, st in self.watch.sweeps.items()  # running or paused: it may end
                    if st.status is not None and not st.status.is_finished()]
        for name in sorted(set(followed) | set(running)):
            sweep = running.get(name) or self.store.get_sweep(name)
            for notice in self.watch.status(sweep):
                self._send(notice)

    def _send(self, notice: Notice) -> None:
        try:
            headline = self.headline(notice.sweep)
        except Exception as exc:  # noqa: BLE001 - the notice goes out without it
            headline = f"(no headline: {type(exc).__name__})"
        event = Event(notice, headline, utcnow())
        for box in self.outboxes:
            if notice.event in box.target.events:
                box.put(event)


def _scrub(text: str, url: str) -> str:
    """`text` without the URL or any of its secret parts (userinfo, path, query)."""
    parts = urlsplit(url)
    for secret in (url, parts.netloc, parts.path, parts.query, parts.password or "",
                   parts.username or ""):
        if secret and len(secret) > 1:
            text = text.replace(secret, "…")
    return text
