"""The short chaos night (tests/chaos_fixtures.py): a kill -9 of `overnight serve` at each moment
class, a full disk, a frozen service; every invariant checked after each fault and at the end.
The long version is benchmarks/chaos.py (100+ kills)."""

from __future__ import annotations

from pathlib import Path

import pytest
from chaos_fixtures import KILL_MOMENTS, Night, cancel_problems, verdict_problems


def test_a_kill_at_every_moment_loses_nothing(tmp_path: Path) -> None:
    night = Night(tmp_path, seed=1, disk_mb=None)
    try:
        night.open()
        for moment in KILL_MOMENTS:
            if moment != "mid_run":  # the recovery fault's first kill is one
                night.fault(moment)
        result = night.finish()
    finally:
        night.close()
    assert result["problems"] == [], result
    assert set(result["faults"]) >= set(KILL_MOMENTS), result
    assert result["kills"] == len(KILL_MOMENTS), result


def test_a_full_disk_is_a_pause_not_a_loss(tmp_path: Path) -> None:
    """Filled while a run is in flight: /health says writes fail, a POST gets 503, the result is
    recorded once space is back and the engine goes on by itself (no resume); then again with a
    kill -9 while full and a restart while still full."""
    night = Night(tmp_path, seed=2)
    if not night.mounted:
        night.close()
        pytest.skip(f"no small filesystem to fill: {night.no_disk}")
    try:
        night.open()
        night.fault("disk_full", end="")
        night.fault("disk_full", end="kill", restart_full=True)
        result = night.finish()
        log = night.server.tail(10_000_000)
    finally:
        night.close()
    assert result["problems"] == [], result
    assert result["faults"] == {"disk_full": 2, "while_full": 1}, result
    assert "writes fail for lack of space" in log and "writes succeed again" in log, log[-3000:]
    assert "paused" not in log, log[-3000:]  # nothing waited for a resume by hand


def test_a_frozen_service_does_not_extend_runs(tmp_path: Path) -> None:
    """SIGSTOP while a hung run is in flight, past its limit: the run's own supervisor ends it
    in time, and the thawed service records it as a timeout."""
    night = Night(tmp_path, seed=3, disk_mb=None)
    try:
        night.open()
        night.fault("freeze")
        result = night.finish()
    finally:
        night.close()
    assert result["problems"] == [], result  # among them: it died while the service was frozen
    assert list(result["frozen"].values()) == ["timeout"], result


def test_the_verdict_check_can_fail() -> None:
    """An accepted proposal left interrupted without a retry, or a retry chain that ends queued,
    is flagged; so is a lost POST that made two rows."""
    exps = [{"id": 1, "status": "interrupted", "description": "a", "meta": {}},
            {"id": 2, "status": "kept", "description": "a", "meta": {"retry_of": 1}},
            {"id": 3, "status": "interrupted", "description": "b", "meta": {}},
            {"id": 4, "status": "queued", "description": "c", "meta": {}},
            {"id": 5, "status": "discarded", "description": "d", "meta": {}},
            {"id": 6, "status": "discarded", "description": "d", "meta": {}}]
    assert verdict_problems(exps, {1: "a"}, []) == []
    assert verdict_problems(exps, {3: "b", 4: "c"}, ["d"]) == [
        "accepted proposal 3 (b) has no verdict: None",
        "accepted proposal 4 (c) has no verdict: queued",
        "a lost POST (d) made 2 proposals"]


def test_the_cancel_check_can_fail() -> None:
    """A change whose cancel was answered must end cancelled, without a retry row, and no
    trainer of it may start after the answer."""
    exps = [{"id": 1, "status": "cancelled", "meta": {}},
            {"id": 2, "status": "interrupted", "meta": {}},
            {"id": 3, "status": "kept", "meta": {"retry_of": 2}},
            {"id": 4, "status": "cancelled", "meta": {}}]
    starts = [(1, 10.0), (4, 10.0), (4, 30.0)]
    assert cancel_problems(exps, {1: 20.0}, starts) == []
    assert cancel_problems(exps, {2: 20.0, 4: 20.0}, starts) == [
        "experiment 2 was cancelled (answered) but ended interrupted",
        "cancelled experiment 2 was re-queued",
        "cancelled experiment 4 started again after its cancel"]
