"""A compute budget through the real loop (git worktrees, subprocesses, SQLite): the fake
trainer of tests/load_world.py on `budget = "200 steps"` trains exactly its steps while the test
switches the machine between 30 % and full speed before every run. Its speed is recorded, and it
moves no run out of the comparison: a real gain is judged and kept, null changes are judged and
discarded, no run is set aside and no incumbent run is started beside a change."""

from __future__ import annotations

import pytest
from load_world import load_night

from agent.core.domain import ExperimentStatus, RunRole, RunStatus
from agent.core.record import Ending


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory):
    return load_night(tmp_path_factory.mktemp("steps"), proposals=3, gains={1: 0.1},
                      budget='budget = "200 steps"', machine_speeds=((0.3, 1.0), 1))


def test_a_change_on_a_compute_budget_is_judged_whatever_the_machine_s_speed(night):
    store, sweep_id, _ = night
    exps = store.list_experiments(sweep_id)
    runs = store.list_runs(sweep_id=sweep_id)
    assert all(r.summary.get("num_steps") == 200 for r in runs), [r.summary for r in runs]
    speeds = [r.throughput for r in runs if r.throughput]
    assert len(speeds) == len(runs) and max(speeds) > 2.5 * min(speeds)  # recorded, and moved
    assert {r.throughput_source for r in runs} == {"summary: num_steps"}
    assert not [r for r in runs if r.status is RunStatus.SUSPECT]
    assert not [r for r in runs if r.role is RunRole.INCUMBENT]  # nothing ran beside a change
    baseline, *changes = exps
    assert baseline.record is not None and baseline.record.change.n == 5
    assert [e.description for e in changes] == ["idea 1", "idea 2", "idea 3"]
    kept = changes[0]
    assert kept.status is ExperimentStatus.KEPT and kept.record is not None
    assert kept.record.ending is Ending.KEPT and not kept.record.set_aside
    assert kept.record.incumbent is not None and kept.record.incumbent.n == 5
    assert len(kept.record.conditions) == 1  # one machine condition, whatever the speeds
    for e in changes[1:]:  # null changes: judged on their runs, none left unjudged
        assert e.status is ExperimentStatus.DISCARDED and e.record is not None
        assert e.record.ending is Ending.NOT_BETTER and not e.record.set_aside, e.reason
