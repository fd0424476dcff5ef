"""Helpers for the dashboard tests: a sweep filled through the real loop, a real uvicorn server,
and a Chromium launcher that fails loudly under CI when the browser is missing."""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from foreground import run_sweep

from agent.core.config import TargetConfig, load_config
from agent.core.domain import (
    CrashKind,
    Experiment,
    ExperimentStatus,
    Finish,
    Proposal,
    Sweep,
    utcnow,
)
from agent.core.ports import ProposalContext
from agent.engine.loop import Loop, LoopSettings
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo, init_repo
from agent.ops.admission import admit, queue
from agent.ops.sweeps import create_sweep
from agent.proposers.knobs import KnobsProposer, make_diff
from db.engine import open_database
from db.store import SqlStore
from runner.summary import ProgressPoint

FAKE_TARGET = Path(__file__).resolve().parent / "fixtures" / "fake_target"
REPO_ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = REPO_ROOT / "artifacts" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SLEEP_LINE = "    time.sleep(min(SLEEP_S, budget) / 3)"
TIMEOUT_S = 4  # the copy's hard limit: a timed-out run costs this plus the grace period


def make_target(root: Path, timeout_s: int = TIMEOUT_S, noise: float = 0.0) -> Path:
    """A git copy of the fake trainer with budget 1 s and a short hard limit (`noise`: its seed
    noise; at 0 it ignores its seed, so each change runs once)."""
    target = root / "target"
    shutil.copytree(FAKE_TARGET, target, ignore=shutil.ignore_patterns("__pycache__"))
    train = target / "train.py"
    train.write_text(train.read_text().replace("NOISE = 0.0", f"NOISE = {noise}"))
    toml = target / "overnight.toml"
    lines = [
        f"timeout_s = {timeout_s}" if ln.startswith("timeout_s") else ln
        for ln in toml.read_text().splitlines()
    ]
    toml.write_text("\n".join(lines) + "\n")
    (target / ".gitignore").write_text("__pycache__/\n")
    init_repo(target)
    return target


def crash_diff(text: str) -> str:
    new = text.replace(
        "value = score(LR, WIDTH, USE_TRICK)",
        'raise MemoryError("CUDA out of memory (fake)")\nvalue = score(LR, WIDTH, USE_TRICK)',
    )
    return make_diff("train.py", text, new)


def sleep_diff(text: str, steps: int, step_s: float) -> str:
    """Run `steps` progress steps `step_s` apart (ignores the budget: for live and timeout runs)."""
    new = text.replace("for step in range(1, 4):", f"for step in range(1, {steps + 1}):")
    new = new.replace(SLEEP_LINE, f"    time.sleep({step_s})")
    return make_diff("train.py", text, new)


RELEASE_ENV = "LIVE_RELEASE"  # the file whose appearance ends a gated run
GATED_LOOP = (
    "step = 0\n"
    f'while not (step >= 3 and os.path.exists(os.environ["{RELEASE_ENV}"])):\n'
    "    step += 1"
)


def gated_diff(text: str, step_s: float) -> str:
    """Print a progress step every `step_s` until the file named by $LIVE_RELEASE exists (and
    at least 3 steps ran): a live run that ends when the test says so, not after a set time."""
    new = text.replace("for step in range(1, 4):", GATED_LOOP)
    new = new.replace(SLEEP_LINE, f"    time.sleep({step_s})")
    return make_diff("train.py", text, new)


class ScriptedProposer:
    """The knobs proposer, with a crashing and a too-slow change slipped in at fixed calls."""

    name = "knobs"
    out_of_ideas: str | None = None

    def __init__(self, seed: int, crash_at: int = 3, timeout_at: int = 5) -> None:
        self.inner = KnobsProposer(seed=seed)
        self.calls = 0
        self.crash_at, self.timeout_at = crash_at, timeout_at

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        self.calls += 1
        text = ctx.files["train.py"]
        if self.calls == self.crash_at:
            return Proposal("allocate a huge activation cache", crash_diff(text), "knobs")
        if self.calls == self.timeout_at:
            return Proposal("sleep far past the budget", sleep_diff(text, 3, 30), "knobs")
        return self.inner.propose(ctx)

    def repair(self, ctx: ProposalContext, failed: Experiment) -> Proposal | None:
        return None


@dataclass
class Filled:
    db: Path
    target: Path
    work: Path
    store: SqlStore
    repo: GitRepo
    sweep: Sweep

    def loop(self, env: dict[str, str] | None = None) -> Loop:
        return Loop(
            self.store,
            self.repo,
            SubprocessRunner(grace_s=0.5),
            LoopSettings(self.work, grace_s=0.5, env=env or {}),
        )

    def queue_live(self, step_s: float = 0.25) -> tuple[Experiment, Path]:
        """Queue (and claim) a healthy run that prints steps until released; returns it and
        the release file to create. Execute it with `loop(env=...).execute(live_sweep(), exp)`
        and RELEASE_ENV set to that file."""
        head = self.repo.head(self.sweep.branch)
        text = self.repo.read_file(head, "train.py")
        proposal = Proposal("slow run for the live panel", gated_diff(text, step_s))
        queued = queue(self.store, admit(self.store, self.repo, self.sweep, proposal))
        claimed = self.store.claim(queued.id)
        assert claimed is not None
        return claimed, self.work / f"release-{claimed.id}"

    def live_sweep(self) -> Sweep:
        """The sweep as a gated run sees it: its hard limit bounds a hang, not the test's pace
        (the recorded sweep keeps its short limit for the timed-out run it contains)."""
        sweep = self.store.get_sweep(self.sweep.name)
        config = TargetConfig.from_dict({**sweep.config.to_dict(), "timeout_s": 300})
        return replace(sweep, config=config)


def fill_sweep(root: Path, name: str = "night", experiments: int = 8, seed: int = 7,
               noise: float = 0.0) -> Filled:
    """A sweep run through the real loop on the fake trainer: baseline, kept and discarded knob
    changes, one fundamental crash and one timeout."""
    target = make_target(root, noise=noise)
    db = root / "overnight.db"
    store = SqlStore(open_database(db))
    repo = GitRepo(target)
    create_sweep(
        store, repo, target, name=name, config=load_config(target), max_experiments=experiments
    )
    work = root / "work"
    loop = Loop(
        store,
        repo,
        SubprocessRunner(grace_s=0.5),
        LoopSettings(work, grace_s=0.5),
        proposer=ScriptedProposer(seed),
    )  # type: ignore[arg-type]
    run_sweep(loop, name)
    return Filled(db, target, work, store, repo, store.get_sweep(name))


LOG = "\n".join(f"step {i} | loss {5 / i:.4f} | elapsed {i * 0.5:.2f}s" for i in range(1, 41))


def fill_direct(root: Path, n: int, seed: int = 1, name: str = "bench") -> str:
    """A sweep of `n` finished experiments written straight through the store (fast): kept,
    discarded and crashed rows with diffs, summaries, log tails and loss points."""
    target = make_target(root)
    store = SqlStore(open_database(root / f"{name}.db"))
    repo = GitRepo(target)
    sweep = create_sweep(
        store, repo, target, name=name, config=load_config(target), max_experiments=n
    )
    head = repo.head(sweep.branch)
    rng = random.Random(seed)
    best = 1.3
    base = store.list_experiments(sweep.id)[0]
    store.claim(base.id)
    store.finish(base.id, Finish(ExperimentStatus.KEPT, metric=best, summary={}, best=best),
                 keep_commit=head)
    start = utcnow() - timedelta(hours=n / 12)
    for i in range(1, n):
        diff = (
            "--- a/train.py\n+++ b/train.py\n@@ -9,3 +9,3 @@\n"
            f" from prepare import score\n-LR = 0.01\n+LR = {0.01 + i * 1e-5:.5f}\n WIDTH = 64\n"
        )
        exp = store.add_experiment(sweep.id, Proposal(f"LR tweak number {i}", diff, "knobs"))
        store.claim(exp.id)
        t0 = start + timedelta(minutes=5 * i)
        store.mark_started(
            exp.id, commit=head, ref=f"refs/overnight/{name}/{exp.id}", run_started_at=t0
        )
        store.add_loss_points(exp.id, [ProgressPoint(s, 5 / s, s * 0.5) for s in range(1, 21)])
        roll = rng.random()
        common = dict(log_tail=LOG, run_started_at=t0, run_ended_at=t0 + timedelta(minutes=5))
        if roll < 0.08:
            store.finish(
                exp.id,
                Finish(ExperimentStatus.CRASHED, CrashKind.FUNDAMENTAL, "out of memory", **common),
            )
            continue
        metric = best + rng.gauss(0.006, 0.005)
        summary = {"val_bpb": metric, "training_seconds": 300.1, "peak_memory_mb": 45060.2}
        if metric < best:
            store.finish(
                exp.id,
                Finish(
                    ExperimentStatus.KEPT,
                    metric=metric,
                    best_before=best,
                    summary=summary,
                    best=metric,
                    **common,
                ),
                keep_commit=head,
            )
            best = metric
        else:
            store.finish(
                exp.id,
                Finish(
                    ExperimentStatus.DISCARDED,
                    metric=metric,
                    best_before=best,
                    summary=summary,
                    **common,
                ),
            )
    return sweep.name


def stamp_hourly(db: Path) -> list[int]:
    """Re-date a database's experiments one an hour, the newest created half an hour ago (a
    history of nights for the time filter); returns their ids, newest first."""
    from sqlalchemy import select, update

    from db.models import ExperimentRow

    engine = open_database(db)
    now = utcnow()
    try:
        with engine.begin() as conn:
            ids = list(conn.scalars(select(ExperimentRow.id).order_by(ExperimentRow.id.desc())))
            for k, i in enumerate(ids):
                conn.execute(update(ExperimentRow).where(ExperimentRow.id == i)
                             .values(created_at=now - timedelta(hours=k + 0.5)))
    finally:
        engine.dispose()
    return ids


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_app(db: Path | str, token: str | None = None, work_dir: Path | None = None) -> Any:
    """The real app (overnight.runtime.service_app, API only: no scheduler) on a SQLite file
    or a PostgreSQL URL (give a PostgreSQL app a `work_dir`: its default is under ~)."""
    from api.settings import Settings
    from overnight.runtime import service_app

    settings = Settings(
        db_path=db,
        auth=token is not None,
        token=token,
        slots=0,
        run_scheduler=False,
        allowed_hosts=("testserver",),  # TestClient's Host
        work_dir=work_dir,
    )
    return service_app(settings)


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Run uvicorn on an ephemeral loopback port in a thread; yields the base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def require_chromium() -> Path:
    """Debian's Chromium; under CI a missing browser is a failure, locally a skip."""
    if CHROMIUM.exists():
        return CHROMIUM
    message = f"{CHROMIUM} is missing: apt-get install -y chromium (never `playwright install`)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
    raise AssertionError("unreachable")


def table_ids(html: str) -> list[int]:
    """The experiment ids in a sweep page's table, in the order shown."""
    body = html.split('id="experiments"')[1].split("</table>")[0]
    return [int(m) for m in re.findall(r'<td class="num"><a href="/ui/experiments/(\d+)"', body)]
