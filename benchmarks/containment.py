"""Containment: a run never outlives its limit, floods stay bounded, hostile diffs stay out.

Measures, with real subprocesses, real git and a real SQLite file:

1. time from the deadline to a dead process tree (every process carrying the run's
   OVERNIGHT_RUN_ID gone, watched by an independent poller) for a trainer flooding its log (with
   and without ignoring SIGTERM), a trainer (and grandchild) ignoring SIGTERM and a trainer whose
   grandchild did setsid()+chdir("/");
2. loss points and log bytes stored for a 1,000,000-line run through the real loop;
3. hostile diffs (tests/hostile_diffs.py) tried and refused by admission.

Targets: every process dead within timeout_s + 10 s in 100 % of trials; <= 5,000 loss points
and <= 25 MB of log; 0 hostile diffs admitted.

    .venv/bin/python benchmarks/containment.py [--trials 5] [--timeout-s 5] [--lines 1000000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from agent.core.config import load_config  # noqa: E402
from agent.core.domain import Proposal  # noqa: E402
from agent.core.errors import AdmissionError  # noqa: E402
from agent.engine.attempt import LossCurve  # noqa: E402
from agent.engine.loop import Loop, LoopSettings  # noqa: E402
from agent.executors.local import SubprocessRunner  # noqa: E402
from agent.git.repo import GitRepo, init_repo  # noqa: E402
from agent.ops.admission import admit, queue  # noqa: E402
from agent.ops.sweeps import create_sweep  # noqa: E402
from db.engine import open_database  # noqa: E402
from db.reads import Reads  # noqa: E402
from db.store import SqlStore  # noqa: E402
from runner import parse_progress, run_command  # noqa: E402
from runner.reaper import pids_with_env  # noqa: E402
from runner.tree import RUN_ID_ENV  # noqa: E402

SCRIPTS = ROOT / "tests" / "scripts"
FAKE_TARGET = ROOT / "tests" / "fixtures" / "fake_target"
TRAINERS = {
    "flooding trainer": ("flood.py", {}),
    "flooding trainer ignoring SIGTERM": ("flood.py", {"FLOOD_IGNORE_TERM": "1"}),
    "SIGTERM-ignoring trainer + grandchild": ("stubborn.py", {"STUBBORN_PID_FILE": "{tmp}/pid"}),
    "setsid grandchild (chdir /)": ("escape.py", {"ESCAPE_PID_FILE": "{tmp}/pid"}),
}
GRACE_S = 5.0
MARGIN_S = 10.0


class DeathWatch(threading.Thread):
    """Polls /proc for processes carrying ``run_id``; records when the last one went."""

    def __init__(self, run_id: str) -> None:
        super().__init__(daemon=True)
        self.run_id, self.seen, self.dead_at = run_id, False, None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            alive = bool(pids_with_env(RUN_ID_ENV, self.run_id))
            if alive:
                self.seen, self.dead_at = True, None
            elif self.seen and self.dead_at is None:
                self.dead_at = time.monotonic()
            time.sleep(0.05)


def one_trial(script: str, env: dict[str, str], timeout_s: float, k: int) -> tuple[float, float]:
    """(deadline -> tree dead, deadline -> run_command returned), in seconds."""
    curve = LossCurve()

    def on_line(line: str) -> None:
        point = parse_progress(line)
        if point is not None:
            curve.add(point)

    with tempfile.TemporaryDirectory() as tmp:
        run_id = f"bench:{script}:{k}"
        env = {key: value.format(tmp=tmp) for key, value in env.items()} | {RUN_ID_ENV: run_id}
        watch = DeathWatch(run_id)
        watch.start()
        started = time.monotonic()
        run_command([sys.executable, str(SCRIPTS / script)], cwd=Path(tmp),
                    log_path=Path(tmp) / "run.log", timeout_s=timeout_s, grace_s=GRACE_S,
                    env=env, on_line=on_line)
        returned = time.monotonic()
        deadline = started + timeout_s
        while watch.dead_at is None and time.monotonic() < returned + 60:
            time.sleep(0.05)
        watch.done.set()
        dead_at = watch.dead_at if watch.dead_at is not None else float("inf")
        return dead_at - deadline, returned - deadline


def kill_times(trials: int, timeout_s: float) -> None:
    print(f"\n## deadline -> dead process tree (timeout_s={timeout_s:g}, grace_s={GRACE_S:g}, "
          f"{trials} trials each; target: <= {MARGIN_S:g} s in 100 %)\n")
    print("| trainer | median s | max s | within target | run_command returned (max s) |")
    print("| --- | --- | --- | --- | --- |")
    for name, (script, env) in TRAINERS.items():
        results = [one_trial(script, env, timeout_s, k) for k in range(trials)]
        dead = [d for d, _ in results]
        ok = sum(d <= MARGIN_S for d in dead)
        print(f"| {name} | {statistics.median(dead):.2f} | {max(dead):.2f} | "
              f"{ok}/{trials} ({100 * ok / trials:.0f} %) | {max(r for _, r in results):.2f} |")


def big_run(lines: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "target"
        target.mkdir()
        for name in ("prepare.py", "overnight.toml"):
            (target / name).write_text((FAKE_TARGET / name).read_text())
        (target / "overnight.toml").write_text(
            (FAKE_TARGET / "overnight.toml").read_text().replace("timeout_s = 20",
                                                                 "timeout_s = 900"))
        (target / "train.py").write_text(
            "import sys, time\nstart = time.time()\nw = sys.stdout.write\n"
            f"for step in range(1, {lines + 1}):\n"
            "    t = time.time() - start\n"
            "    w(f'step {step} | loss {5.0 / step:.6f} | elapsed {t:.3f}s\\n')\n"
            "print('---')\nprint('val_bpb: 1.0')\n")
        init_repo(target)
        db = Path(tmp) / "o.db"
        store = SqlStore(open_database(db))
        sweep = create_sweep(store, GitRepo(target), target, name="big",
                             config=load_config(target))
        loop = Loop(store, GitRepo(target), SubprocessRunner(), LoopSettings(Path(tmp) / "work"))
        started = time.monotonic()
        done = loop.execute(sweep, store.claim_next(sweep.id))
        wall = time.monotonic() - started
        points = Reads(store).loss_points(done.id)
        log_bytes = Path(done.log_path or "").stat().st_size
        db_bytes = sum(f.stat().st_size for f in Path(tmp).glob("o.db*") if f.is_file())
        print(f"\n## one {lines:,}-line run through the loop (target: <= 5,000 points, "
              "<= 25 MB log)\n")
        print("| status | loss points | last step | log bytes | database bytes (+wal) | wall s |")
        print("| --- | --- | --- | --- | --- | --- |")
        print(f"| {done.status.value} | {len(points):,} | {points[-1].step if points else '-'} "
              f"| {log_bytes:,} | {db_bytes:,} | {wall:.1f} |")


def hostile() -> None:
    from hostile_diffs import README, all_cases

    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "target"
        target.mkdir()
        for name in ("prepare.py", "overnight.toml", "train.py"):
            (target / name).write_text((FAKE_TARGET / name).read_text())
        (target / "README.md").write_text(README)
        (target / "empty.txt").write_text("")
        init_repo(target)
        store = SqlStore(open_database(Path(tmp) / "o.db"))
        repo = GitRepo(target)
        sweep = create_sweep(store, repo, target, name="h", config=load_config(target))
        cases = all_cases(target)
        admitted = []
        for name, diff in cases.items():
            try:
                queue(store, admit(store, repo, sweep, Proposal("hostile", diff)))
                admitted.append(name)
            except AdmissionError:
                pass
        print("\n## hostile diffs (target: 0 admitted)\n")
        print(f"tried {len(cases)}, refused {len(cases) - len(admitted)}, admitted "
              f"{len(admitted)} {admitted if admitted else ''}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--timeout-s", type=float, default=5.0)
    ap.add_argument("--lines", type=int, default=1_000_000)
    args = ap.parse_args()
    kill_times(args.trials, args.timeout_s)
    big_run(args.lines)
    hostile()


if __name__ == "__main__":
    main()
