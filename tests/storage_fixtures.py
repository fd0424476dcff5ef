"""A recorded night for the storage tests and benchmarks/storage.py: real rows written through
the Store (a real SQLite file), real log files where the engine writes them, real loss points,
and leftover worktrees made by git itself, dated as if the night ended `age` ago."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from service_fixtures import knob_diff
from sqlalchemy import update

from agent.core.domain import (
    ExperimentStatus,
    Finish,
    Proposal,
    RunEnd,
    RunRole,
    RunSpec,
    RunStatus,
    utcnow,
)
from agent.git.repo import GitRepo
from agent.ops.sweeps import create_sweep
from db.models import ExperimentRow
from db.store import SqlStore
from runner.summary import ProgressPoint

# One night's mix on one GPU (autoresearch-like): most changes discarded, some crash.
STATUS_MIX = ((ExperimentStatus.KEPT, 0.15), (ExperimentStatus.DISCARDED, 0.70),
              (ExperimentStatus.CRASHED, 0.10), (ExperimentStatus.TIMEOUT, 0.05))
LINE = "step {step:5d}/{steps} | loss {loss:.6f} | lr 3.00e-04 | dt 291.4ms | tok/s 112,452\n"


@dataclass
class Night:
    sweep: str
    ids: dict[ExperimentStatus, list[int]] = field(default_factory=dict)
    worktrees: list[Path] = field(default_factory=list)
    queued: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)


def _log(path: Path, steps: int, rng: random.Random) -> list[ProgressPoint]:
    points = [ProgressPoint(s, 4.0 * 0.999 ** s + rng.random() * 0.05, s * 0.29)
              for s in range(steps)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for p in points:
            fh.write(LINE.format(step=p.step, steps=steps, loss=p.loss))
        fh.write("---\nval_bpb: 1.234567\ntraining_seconds: 300.1\npeak_vram_mb: 44000.0\n")
    return points


def _status(rng: random.Random) -> ExperimentStatus:
    pick, acc = rng.random(), 0.0
    for status, share in STATUS_MIX:
        acc += share
        if pick < acc:
            return status
    return ExperimentStatus.DISCARDED


def _record(store: SqlStore, repo: GitRepo, night: Night, sweep_id: int, k: int, *,
            work_dir: Path, steps: int, target: Path, rng: random.Random) -> None:
    diff = knob_diff(target, k, 1)
    exp = store.add_experiment(sweep_id, Proposal(f"K{k} = 1", diff))
    store.claim(exp.id)
    commit = repo.commit_proposal(repo.head(f"overnight/{night.sweep}"), diff, f"K{k} = 1")[0]
    ref = f"refs/overnight/{night.sweep}/{exp.id}"  # the hidden ref the loop keeps
    repo.set_ref(ref, commit)
    log = work_dir / "logs" / night.sweep / f"{exp.id}.log"
    points = _log(log, steps, rng)
    store.mark_started(exp.id, log_path=str(log), commit=commit, ref=ref)
    store.add_loss_points(exp.id, points)
    run = store.start_run(RunSpec(sweep_id, exp.id, commit, 42, RunRole.SCREEN, str(log)))
    store.end_run(run.id, RunEnd(RunStatus.OK, metric=1.2))
    status = _status(rng)
    tail = "".join(LINE.format(step=p.step, steps=steps, loss=p.loss) for p in points[-50:])
    store.finish(exp.id, Finish(status, metric=None if status is ExperimentStatus.CRASHED
                                else 1.2 + rng.random() * 0.01, best_before=1.2,
                                summary={"val_bpb": 1.2, "training_seconds": 300.1,
                                         "peak_vram_mb": 44000.0, "num_steps": steps},
                                log_tail=tail))
    night.ids.setdefault(status, []).append(exp.id)


def seed_night(store: SqlStore, target: Path, work_dir: Path, *, sweep: str,
               experiments: int, steps: int = 1000, age: timedelta = timedelta(0),
               leftover_worktrees: int = 0, seed: int = 0) -> Night:
    """`experiments` finished experiments of one sweep (knob K0.. of the counting target), each
    with a log of `steps` progress lines, as many loss points and a run; finished `age` ago.
    The first `leftover_worktrees` also keep the worktree a killed process would leave."""
    rng = random.Random(seed)
    repo = GitRepo(target)
    sw = create_sweep(store, repo, target, name=sweep, proposer="queue")
    night = Night(sweep)
    store.claim_next(sw.id)  # the baseline, recorded like the others below
    base = store.list_experiments(sw.id)[0]
    store.finish(base.id, Finish(ExperimentStatus.KEPT, metric=1.2, summary={"val_bpb": 1.2}))
    for k in range(experiments):
        _record(store, repo, night, sw.id, k, work_dir=work_dir, steps=steps, target=target,
                rng=rng)
    finished = [i for ids in night.ids.values() for i in ids]
    for exp_id in finished[:leftover_worktrees]:
        wt = work_dir / "worktrees" / sweep / f"exp-{exp_id}"
        repo.add_worktree(wt, repo.head(f"overnight/{sweep}"))
        night.worktrees.append(wt)
    with store.session("dating the night") as s:
        s.execute(update(ExperimentRow).where(ExperimentRow.sweep_id == sw.id)
                  .values(finished_at=utcnow() - age))
    return night
