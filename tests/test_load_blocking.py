"""Blocking in time through the real loop (git worktrees, subprocesses, SQLite) on a machine
whose speed the test sets (tests/load_world.py): a fake trainer whose work follows the
machine's speed, 12 null changes, the machine busy for the baseline and then switching every
five runs. Every change run after the busy baseline looks 40 σ better; only the incumbent run
beside it, in the same conditions, shows that the machine moved. Also what the evidence,
`results --format json` and the dashboard say of those runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from browser_helpers import make_app
from fastapi.testclient import TestClient
from load_world import load_night
from test_cli import run

from agent.core.domain import ExperimentStatus, RunRole, RunStatus
from db.store import SqlStore


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> tuple[SqlStore, int, Path]:
    return load_night(tmp_path_factory.mktemp("load"))


def test_the_machines_speed_is_not_credited_to_a_null_change(night):
    store, sweep_id, _ = night
    changes = [e for e in store.list_experiments(sweep_id) if not e.is_baseline]
    kept = [e for e in changes if e.status is ExperimentStatus.KEPT]
    runs = store.list_runs(sweep_id=sweep_id)
    beside = [r for r in runs if r.role is RunRole.INCUMBENT and r.pair_run_id]
    assert len(changes) == 12 and len(kept) <= 1, [e.reason for e in kept]
    assert beside
    seeds: dict[str, list[int]] = {}
    for r in runs:  # a commit never runs a seed twice: that would measure its luck twice
        seeds.setdefault(r.commit, []).append(r.seed)
    assert all(len(v) == len(set(v)) for v in seeds.values()), seeds
    assert {r.throughput_source for r in runs if r.metric is not None} == {"summary: num_steps"}
    notes = [r.note or "" for r in runs]
    assert any("the machine" in n for n in notes), notes
    assert any(r.status is RunStatus.SUSPECT for r in runs)
    baseline = store.list_experiments(sweep_id)[0]
    assert not any("cannot be checked" in w for w in baseline.meta.get("warnings", []))


def test_results_json_names_the_pairs_and_why_a_run_was_set_aside(night):
    store, sweep_id, db = night
    rows = json.loads(run("results", "--sweep", "load", "--format", "json", "--db",
                          str(db)).stdout)["experiments"]
    pairs = [p for r in rows for p in r["pairs"]]
    assert pairs and all(set(p) == {"run", "incumbent_run"} for p in pairs)
    by_id = {r.id: r for r in store.list_runs(sweep_id=sweep_id)}
    assert all(by_id[p["incumbent_run"]].pair_run_id == p["run"] for p in pairs)
    # a run set aside (in no value) says why, and it is the runs the store marks suspect: one
    # definition of "set aside" on every screen
    aside = {s["run"]: s["why"] for r in rows for s in r["set_aside"]}
    assert set(aside) == {r.id for r in by_id.values() if r.status is RunStatus.SUSPECT
                          and r.role is not RunRole.INCUMBENT}
    assert all("/s" in why or "speed" in why for why in aside.values())
    # a run compared in another machine condition says so in its note, its throughput named
    noted = [run for r in rows for run in r["run_records"] if run["note"]]
    assert noted and any("/s" in run["note"] for run in noted)


def test_the_dashboard_marks_the_load_shifts(night):
    store, sweep_id, db = night
    with TestClient(make_app(db)) as client:
        page = client.get("/ui/sweeps/load").text
        assert 'class="load"' in page and "load shift: run" in page
        assert "Machine&#39;s load" in page or "Machine's load" in page
        paired = next(r for r in store.list_runs(sweep_id=sweep_id) if r.pair_run_id)
        change = next(r for r in store.list_runs(sweep_id=sweep_id) if r.id == paired.pair_run_id)
        exp_page = client.get(f"/ui/experiments/{change.experiment_id}").text
        assert f"beside run {change.id}" in exp_page and "summary: num_steps" in exp_page
