"""Notifications against a real HTTP receiver on loopback: a night through the real engine that
keeps, crashes three times in a row, stalls into a plateau, gets paused and ends; each event
POSTed as overnight's JSON, a Slack body and an ntfy message with the report's headline. And
the failures: a receiver that is down (the night goes on, the failure is logged once, the URL
redacted), one that answers 503 first (retried with backoff), one that hangs (the engine never
waits on it).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from browser_helpers import crash_diff
from conftest import make_target
from notify_receiver import closed_port, receiver

from agent.core.config import load_config
from agent.core.diff import make_diff
from agent.core.domain import Experiment, Proposal, SweepStatus, utcnow
from agent.core.errors import ConfigError
from agent.core.ports import ProposalContext
from agent.engine.loop import Loop, LoopSettings
from agent.engine.scheduler import SchedulerSettings, SlotScheduler
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo
from agent.ops.morning import headline_of
from agent.ops.notify import (
    Event,
    Notice,
    Notifier,
    Outbox,
    load_notify_config,
    redact,
    target_of,
    urllib_post,
)
from agent.ops.sweeps import create_sweep
from db.engine import open_database
from db.store import SqlStore

OVERNIGHT = Path(sys.executable).parent / "overnight"


class Night:
    """Keep LR 0.04, three crashes, three discards (a plateau), then the proposer breaks (the
    engine pauses the sweep); once resumed it has nothing more (the sweep ends)."""

    name = "knobs"
    out_of_ideas: str | None = None

    def __init__(self) -> None:
        self.calls = 0
        self.resumed = False

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        self.calls += 1
        text, k = ctx.files["train.py"], self.calls
        if self.resumed:
            return None
        if k == 1:
            return Proposal("LR 0.01 -> 0.04", make_diff(
                "train.py", text, text.replace("LR = 0.01", "LR = 0.04")))
        if k <= 4:
            diff = crash_diff(text).replace("(fake)", f"(fake {k})")
            return Proposal(f"a huge cache {k}", diff)
        edits = {5: ("WIDTH = 64", "WIDTH = 32"), 6: ("WIDTH = 64", "WIDTH = 48"),
                 7: ("LR = 0.04", "LR = 0.08")}
        if k in edits:
            old, new = edits[k]
            return Proposal(f"{old} -> {new}", make_diff("train.py", text,
                                                         text.replace(old, new)))
        raise RuntimeError("the proposer broke")

    def repair(self, ctx: ProposalContext, failed: Experiment) -> Proposal | None:
        return None


def engine(tmp_path: Path, proposer, notifier: Notifier | None, name: str = "night"
           ) -> tuple[SqlStore, SlotScheduler]:  # type: ignore[no-untyped-def]
    target = make_target(tmp_path / "target")
    store = SqlStore(open_database(tmp_path / "overnight.db"))
    repo = GitRepo(target)
    create_sweep(store, repo, target, name=name, config=load_config(target), max_experiments=20)
    on_event = notifier.on_event if notifier is not None else None
    loop = Loop(store, repo, SubprocessRunner(grace_s=0.5), LoopSettings(tmp_path / "work"),
                proposer=proposer, on_event=on_event)
    return store, SlotScheduler(store, SchedulerSettings(), lambda _s, _n: loop)


def notifier_for(store: SqlStore, urls: list[str], **options) -> Notifier:  # type: ignore[no-untyped-def]
    return Notifier([target_of(u) for u in urls], store,
                    headline=lambda n: headline_of(store, n).text(), **options)


def test_a_night_posts_each_event_in_three_shapes(tmp_path):
    with receiver() as rx:
        urls = [f"{rx.url}/hook", f"slack+{rx.url}/slack", f"ntfy+{rx.url}/topic"]
        proposer = Night()
        store, slots = engine(tmp_path, proposer, None)
        notifier = notifier_for(store, urls, poll_s=0.1)
        slots.loop_factory(store.get_sweep("night"), 0).on_event = notifier.on_event
        notifier.start()
        slots.run_burst(["night"])  # ends when the proposer breaks: the sweep is paused
        assert store.get_sweep("night").status is SweepStatus.PAUSED
        rx.wait_for(lambda got: ("/hook", "paused") in rx.events())
        proposer.resumed = True
        store.set_sweep_status("night", SweepStatus.RUNNING)
        slots.run_burst(["night"])
        assert store.get_sweep("night").status is SweepStatus.DONE
        notifier.close()
        got = rx.wait_for(lambda got: len(got) == 15)
    by_path: dict[str, list] = {}
    for r in got:
        by_path.setdefault(r.path, []).append(r)
    events = [r.json() for r in by_path["/hook"]]
    print("\n--- the notifications, as the receiver got them ---")
    for e in events:
        print(f"{e['event']:<13} {e['title']} | {e['text']} | {e['headline']}")
    assert [e["event"] for e in events] == ["keep", "crash_streak", "plateau", "paused", "done"]
    keep, streak, plateau, paused, done = events
    assert keep["experiment"]["description"] == "LR 0.01 -> 0.04"
    assert keep["headline"].startswith("val_bpb 1.300000 → 1.100000")
    assert streak["text"].count("CUDA out of memory") == 3
    assert plateau["text"].startswith("6 runs without a keep")
    assert paused["status"] == "paused" and done["status"] == "done"
    assert done["report"] == "overnight report --sweep night"
    # the fake trainer ignores its seed: its keep rests on one run, and the headline says so
    assert "kept on one run each: the noise was not measured" in done["headline"]
    slack = [r.json() for r in by_path["/slack"]]
    assert all(set(b) == {"text"} for b in slack) and len(slack) == 5
    assert slack[0]["text"].startswith("*night: kept #") and keep["headline"] in slack[0]["text"]
    ntfy = by_path["/topic"]
    assert [r.headers["Title"] for r in ntfy] == [e["title"] for e in events]
    assert ntfy[1].headers["Priority"] == "high" and ntfy[0].headers["Tags"]
    assert ntfy[-1].body.decode().endswith(done["headline"])


def test_a_receiver_that_is_down_costs_the_night_nothing(tmp_path):
    port = closed_port()
    secrets = ("SECRETPATH", "SECRETTOKEN", "SECRETPW", "SECRETSLACK")
    target = make_target(tmp_path / "target")
    with receiver() as rx:
        proc = subprocess.run(
            [str(OVERNIGHT), "run", "--target", str(target), "--sweep", "s", "--experiments",
             "3", "--budget", "1", "--db", str(tmp_path / "o.db"),
             "--notify", f"http://127.0.0.1:{port}/hook/SECRETPATH?token=SECRETTOKEN",
             "--notify", f"slack+http://u:SECRETPW@127.0.0.1:{port}/services/T0/B0/SECRETSLACK",
             "--notify", f"{rx.url}/alive"],
            capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, "COLUMNS": "200"})
        events = [e for _, e in rx.events()]
    print(proc.stderr)
    assert proc.returncode == 0, proc.stderr
    statements = ("kept by the test", "kept on one run each", "nothing beat the noise")
    assert any(s in proc.stdout for s in statements), proc.stdout  # the night's last line
    failed = [ln for ln in proc.stderr.splitlines() if "failed (" in ln]
    assert failed == [
        f"WARNING agent.ops.notify: notifications to http://127.0.0.1:{port}/… failed "
        "(URLError: [Errno 111] Connection refused); the night goes on, and further failures "
        "of this URL are not logged until it works again"] * 2
    for secret in secrets:
        assert secret not in proc.stdout + proc.stderr
    assert events[-1] == "done"  # the live receiver heard the night out


def test_a_failing_post_is_retried_with_backoff(caplog):
    with receiver(fail_first=2, fail_status=503) as rx:
        box = Outbox(target_of(f"{rx.url}/hook?token=SECRET"), urllib_post, retries=3,
                     backoff_s=0.01, max_backoff_s=0.05, timeout_s=10, queue_size=4)
        event = Event(Notice("keep", "night", "night: kept #2", "val_bpb 1.1"), "headline",
                      utcnow())
        with caplog.at_level(logging.DEBUG, logger="agent.ops.notify"):
            assert box.deliver(event)
        assert rx.seen == 3 and [r.json()["event"] for r in rx.got] == ["keep"]
    attempts = [r.getMessage() for r in caplog.records if "attempt" in r.getMessage()]
    assert attempts == [f"notify {redact(rx.url + '/hook')}: attempt {i} failed: HTTP 503"
                        for i in (1, 2)]
    assert all("SECRET" not in r.getMessage() for r in caplog.records)
    # 4xx (but 408/429) is the receiver saying no: not retried.
    with receiver(fail_first=5, fail_status=404) as rx:
        box = Outbox(target_of(f"{rx.url}/x"), urllib_post, retries=3, backoff_s=0.01,
                     max_backoff_s=0.05, timeout_s=10, queue_size=4)
        assert not box.deliver(event) and rx.seen == 1 and box.failing


def test_the_engine_never_waits_for_a_hanging_receiver(tmp_path, caplog):
    hold = threading.Event()
    with receiver(hold=hold) as rx:
        store, slots = engine(tmp_path, Night(), None)
        notifier = notifier_for(store, [f"{rx.url}/hook"], poll_s=0.1, retries=0,
                                queue_size=8)
        slots.loop_factory(store.get_sweep("night"), 0).on_event = notifier.on_event
        notifier.start()
        slots.run_burst(["night"])  # the whole night (to its pause) while the POSTs hang
        assert store.get_sweep("night").status is SweepStatus.PAUSED
        assert rx.got == []  # nothing was answered: the receiver holds every request
        exp = store.list_experiments(store.get_sweep("night").id)[-1]
        with caplog.at_level(logging.WARNING, logger="agent.ops.notify"):
            for _ in range(100):  # the engine's callback returns at once even when full
                notifier.on_event("finished", exp, {})
        assert notifier.dropped > 0
        full = [r for r in caplog.records if "queue is full" in r.getMessage()]
        assert len(full) == 1
        hold.set()
        notifier.close(timeout_s=30)
        assert ("/hook", "keep") in rx.events()


def test_notify_urls_and_files_are_checked(tmp_path):
    assert target_of("https://hooks.slack.com/services/T0/B0/X").format == "slack"
    assert target_of("https://ntfy.sh/topic").format == "ntfy"
    assert target_of("https://example.com/hook").format == "json"
    assert target_of("json+https://hooks.slack.com/x").format == "json"
    assert redact("https://u:p@hooks.slack.com:8443/services/T/B/X?t=1#f") == \
        "https://hooks.slack.com:8443/…"
    assert redact("http://example.com") == "http://example.com"
    with pytest.raises(ConfigError, match=r"ftp://h/… is not an http:// or https:// URL"):
        target_of("ftp://h/secret")
    good = tmp_path / "notify.toml"
    good.write_text('crash_streak = 2\n[[notify]]\nurl = "https://ntfy.sh/t"\n'
                    'events = ["keep", "done"]\n[[notify]]\nurl = "https://x.org/h"\n'
                    'format = "slack"\n')
    config = load_notify_config(good)
    assert config.crash_streak == 2 and [t.format for t in config.targets] == ["ntfy", "slack"]
    assert config.targets[0].events == {"keep", "done"}
    bad = tmp_path / "bad.toml"
    bad.write_text('[[notify]]\nurl = "https://x.org/SECRET"\nevents = ["kept"]\n')
    with pytest.raises(ConfigError, match=r"#1: events must list some of keep, crash_streak"):
        load_notify_config(bad)
    bad.write_text('[[notify]]\nurl = "https://x.org/SECRET"\nformat = "teams"\n')
    with pytest.raises(ConfigError) as exc:
        load_notify_config(bad)
    assert "format 'teams'" in str(exc.value) and "SECRET" not in str(exc.value)
    proc = subprocess.run([str(OVERNIGHT), "run", "--target", str(tmp_path), "--notify",
                           "htp://x/SECRET", "--db", str(tmp_path / "o.db")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "htp://x/… is not an http:// or https:// URL" in proc.stderr
    assert "SECRET" not in proc.stderr
