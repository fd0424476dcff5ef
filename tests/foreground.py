"""Run one sweep to its end in the foreground with a given Loop: the engine in burst mode, for
tests and benchmarks that build their own Loop (the CLI builds its engine through Runtime)."""

from __future__ import annotations

from typing import Any

from agent.core.domain import Sweep
from agent.engine.scheduler import SchedulerSettings, SlotScheduler


def run_sweep(loop: Any, name: str, settings: SchedulerSettings | None = None) -> Sweep:
    """The sweep `name` run by `loop` on one slot until nothing is left to start; the sweep
    as it ended. The scheduler gets the loop's own store (not the copy that waits out a full
    disk: a claim must not wait in the pick)."""
    store = getattr(loop.store, "inner", loop.store)
    engine = SlotScheduler(store, settings or SchedulerSettings(), lambda _s, _n: loop,
                           disk_space=loop.disk_space)
    engine.run_burst([name])
    done: Sweep = loop.store.get_sweep(name)
    return done
