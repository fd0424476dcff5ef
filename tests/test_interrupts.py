"""Ctrl-C and SIGTERM in a foreground run wait for the store transaction in progress: real
signals to this process (the handlers `overnight run` installs) and a real SQLite store."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update
from test_store_contract import spec

from agent.core.domain import Proposal
from agent.core.errors import Interrupted
from db.engine import open_database
from db.models import SweepRow
from db.store import SqlStore
from overnight.cli import interrupt_handlers


@pytest.fixture
def handlers() -> Iterator[None]:
    previous = interrupt_handlers()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    engine = open_database(tmp_path / "o.db")
    yield SqlStore(engine)
    engine.dispose()


@pytest.mark.parametrize(("sig", "raised"), [(signal.SIGINT, KeyboardInterrupt),
                                             (signal.SIGTERM, Interrupted)])
def test_a_signal_inside_a_write_waits_for_its_commit(handlers, store: SqlStore, sig: int,
                                                     raised: type[BaseException]) -> None:
    """The signal lands mid-transaction (the handler runs at once, on this thread): the write
    goes on and commits whole, and the exception is raised when the transaction has ended."""
    sweep = store.create_sweep(spec())
    row = SweepRow.__table__.c
    reached = False
    with pytest.raises(raised):
        with store.session("a write a signal lands in") as s:
            s.execute(update(SweepRow).where(row.id == sweep.id).values(max_experiments=7))
            os.kill(os.getpid(), sig)  # the handler runs before the next line
            s.execute(update(SweepRow).where(row.id == sweep.id).values(baseline_metric=1.5))
            reached = True
    after = store.get_sweep("s")
    assert reached and after.max_experiments == 7 and after.baseline_metric == 1.5


def test_outside_a_transaction_it_is_raised_at_once(handlers, store: SqlStore) -> None:
    reached = False
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        reached = True
    assert not reached


def test_a_second_signal_while_one_waits_is_raised_at_once(handlers, store: SqlStore) -> None:
    """The way out of a write that is stuck: the second Ctrl-C does not wait."""
    sweep = store.create_sweep(spec())
    after_second = False
    with pytest.raises(KeyboardInterrupt):
        with store.reading():  # one transaction over several reads
            store.get_sweep("s")
            os.kill(os.getpid(), signal.SIGINT)  # waits
            store.list_experiments(sweep.id)
            os.kill(os.getpid(), signal.SIGINT)  # raised here
            after_second = True
    assert not after_second
    # nothing is left waiting: the next transaction ends normally
    store.add_experiment(sweep.id, Proposal("after", "d"))


def test_other_threads_transactions_do_not_hold_a_signal(handlers, store: SqlStore) -> None:
    """Only the main thread's transactions defer (signals are raised on the main thread)."""
    inside, release = threading.Event(), threading.Event()

    def slot() -> None:
        with store.session("another thread's transaction"):
            inside.set()
            release.wait(60)

    t = threading.Thread(target=slot)
    t.start()
    try:
        assert inside.wait(60)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        release.set()
        t.join(60)
