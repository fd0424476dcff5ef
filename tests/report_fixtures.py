"""A night for the morning report's tests: the fake trainer with seed noise, run through the real
loop (kept and discarded knob changes, a fundamental crash, a timeout), some LLM spend recorded,
and the numbers the report must show worked out from the records independently of it."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest
from browser_helpers import ScriptedProposer, make_target
from foreground import run_sweep
from scipy import stats

from agent.core.config import load_config
from agent.core.domain import Experiment, ExperimentStatus, Run, RunRole, RunStatus
from agent.engine.loop import Loop, LoopSettings
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo
from agent.ops.sweeps import create_sweep
from db.engine import open_database
from db.store import SqlStore

LLM = (12_345, 2_345, 0.1234)  # tokens in, tokens out, dollars


@dataclass
class Night:
    db: Path
    target: Path
    work: Path
    store: SqlStore
    name: str


def noisy_night(root: Path, name: str = "night", experiments: int = 9,
                incumbent_every: int | None = None, noise: float = 0.004) -> Night:
    """`incumbent_every`: re-run the best that often (else the target's setting); `noise`: the
    seed noise added to each run's metric."""
    target = make_target(root)
    train = target / "train.py"
    train.write_text(train.read_text().replace("NOISE = 0.0", f"NOISE = {noise}"))
    toml = target / "overnight.toml"  # seed noise now: σ̂ is measured
    text = toml.read_text()
    if incumbent_every is not None:
        text = text.replace("[target]\n", f"[target]\nincumbent_every = {incumbent_every}\n", 1)
    toml.write_text(text)
    import git

    from agent.git.repo import IDENTITY

    git.Repo(target).git.commit("-am", "seed noise", env=IDENTITY)
    store = SqlStore(open_database(root / "overnight.db"))
    repo = GitRepo(target)
    create_sweep(store, repo, target, name=name, config=load_config(target),
                 max_experiments=experiments)
    loop = Loop(store, repo, SubprocessRunner(grace_s=0.5),
                LoopSettings(root / "work", grace_s=0.5),
                proposer=ScriptedProposer(7))  # type: ignore[arg-type]
    run_sweep(loop, name)
    sweep = store.get_sweep(name)
    store.add_llm_usage(sweep.id, None, *LLM)
    return Night(root / "overnight.db", target, root / "work", store, name)


def recorded(runs: list[Run], commit: str) -> tuple[float, int]:
    """A commit's value as the keep rule records it, and its runs in the usual condition."""
    from agent.rules.run_records import recorded_best

    value, _, off = recorded_best(runs, commit)
    assert value is not None
    return value, sum(not o for o in off)


def ok(runs: list[Run], commit: str) -> list[float]:
    return [r.metric for r in runs if r.commit == commit and r.status is RunStatus.OK
            and r.metric is not None]


def pooled_sd(runs: list[Run]) -> float | None:
    return pooled(runs)[0]


def pooled(runs: list[Run]) -> tuple[float | None, int]:
    """The pooled within-commit sd of the OK runs and its degrees of freedom."""
    groups: dict[str, list[float]] = {}
    for r in runs:
        if r.status is RunStatus.OK and r.metric is not None:
            groups.setdefault(r.commit, []).append(r.metric)
    ss = sum(sum((v - statistics.fmean(g)) ** 2 for v in g) for g in groups.values()
             if len(g) > 1)
    df = sum(len(g) - 1 for g in groups.values() if len(g) > 1)
    return (math.sqrt(ss / df) if df else None), df


def expected(night: Night) -> dict[str, object]:
    """What the report must say, from the records (not from the report's code)."""
    store = night.store
    sweep = store.get_sweep(night.name)
    exps = store.list_experiments(sweep.id)
    runs = store.list_runs(sweep_id=sweep.id)
    base = next(e for e in exps if e.is_baseline)
    # the baseline and the best are the keep rule's record of them (the sweep's, as
    # agent.rules.placement.recorded_best defines them: on their runs in the usual condition)
    base_value, base_n = recorded(runs, base.commit or "")
    best_value, best_n = recorded(runs, sweep.best_commit or "")
    assert (base_value, best_value) == pytest.approx((sweep.baseline_metric, sweep.best_metric))
    sd, df = pooled(runs)
    gain = base_value - best_value
    ci = (stats.t.ppf(0.975, df) * sd * math.sqrt(1 / base_n + 1 / best_n)
          if sd is not None else None)  # Student's t on σ̂'s degrees of freedom
    kept = [e for e in exps if e.status is ExperimentStatus.KEPT and not e.is_baseline]
    status_of = {e.id: e for e in exps}
    hours: dict[str, float] = {}
    count: dict[str, int] = {}
    for r in runs:
        e = status_of[r.experiment_id]
        bucket = ("incumbent re-runs" if r.role is RunRole.INCUMBENT else "baseline"
                  if e.is_baseline else e.status.value)
        assert r.started_at and r.ended_at
        hours[bucket] = hours.get(bucket, 0.0) + (r.ended_at - r.started_at).total_seconds() / 3600
        count[bucket] = count.get(bucket, 0) + 1
    crashes: dict[tuple[str, str, str], list[int]] = {}
    for e in exps:
        if e.status in (ExperimentStatus.CRASHED, ExperimentStatus.TIMEOUT):
            key = (e.status.value, e.crash_kind.value if e.crash_kind else "",
                   e.crash_cause or "")
            crashes.setdefault(key, []).append(e.id)
    return {"baseline": base_value, "best": best_value,
            "base_n": base_n, "best_n": best_n, "gain": gain, "ci": ci,
            "kept": [kept_row(e, runs) for e in kept], "hours": hours, "count": count,
            "crashes": crashes, "runs": len(runs),
            "counts": {s.value: sum(e.status is s for e in exps) for s in ExperimentStatus}}


def kept_row(e: Experiment, runs: list[Run]) -> dict[str, object]:
    """A kept change as the report should show it, from the run records its record names: the
    mean of its own runs, their n, and the difference from the incumbent runs it was compared
    with (each machine condition's difference of means, weighted 1/(1/n_change + 1/n_inc))."""
    by_id = {r.id: r for r in runs}
    lines = e.diff.splitlines()
    added = sum(ln.startswith("+") and not ln.startswith("+++") for ln in lines)
    removed = sum(ln.startswith("-") and not ln.startswith("---") for ln in lines)
    record = e.record
    assert record is not None and record.change.n
    mine = [by_id[i].metric for i in record.change.runs]
    assert all(by_id[i].experiment_id == e.id for i in record.change.runs)
    total = weight = 0.0
    for change, incumbent in record.conditions:
        a = [by_id[i].metric for i in change.runs]
        b = [by_id[i].metric for i in incumbent.runs]
        w = 1.0 / (1.0 / len(a) + 1.0 / len(b))
        total += w * (sum(a) / len(a) - sum(b) / len(b))  # type: ignore[arg-type]
        weight += w
    return {"id": e.id, "mean": sum(mine) / len(mine), "n": len(mine),  # type: ignore[arg-type]
            "delta": total / weight, "added": added, "removed": removed,
            "commit": (e.commit or "")[:7]}
