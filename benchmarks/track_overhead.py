"""What mirroring the night to a tracker costs it: the same knobs sweep on the trivial fake
trainer through the real loop, without a tracker, mirrored to a real MLflow server on loopback
(sqlite backend, started here) and to W&B in offline mode.

For each: the night's wall time and the service's gap between runs (one run's exit to the next
run's start: what the engine itself spends, where a tracker that held it up would show), the
tracker's own time per experiment on the mirror's thread (its calls for one experiment), how
long after an experiment's end the tracker had it (the lag), and the mirror's close at the end.

    .venv/bin/python benchmarks/track_overhead.py [--experiments 20] [--modes none mlflow wandb]
        [--rounds 3]

With several rounds the modes take turns (none, mlflow, wandb, none, …), so a change in the
shared machine's load falls on each, and the figures pool every round's experiments.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from foreground import run_sweep  # noqa: E402
from tracker_fixtures import start_mlflow_server  # noqa: E402

from agent.core.config import load_config  # noqa: E402
from agent.core.tracking import TrackTable  # noqa: E402
from agent.engine.loop import Loop, LoopSettings  # noqa: E402
from agent.executors.local import SubprocessRunner  # noqa: E402
from agent.git.repo import GitRepo, init_repo  # noqa: E402
from agent.ops.sweeps import create_sweep  # noqa: E402
from agent.ops.track import Mirror, make_tracker  # noqa: E402
from agent.proposers.knobs import KnobsProposer  # noqa: E402
from db.engine import open_database  # noqa: E402
from db.reads import Reads  # noqa: E402
from db.store import SqlStore  # noqa: E402
from db.track_marks import TrackMarks  # noqa: E402


class Timed:
    """A tracker whose calls for each experiment are timed."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.destination = inner, inner.destination
        self.per_experiment: list[float] = []

    def log_experiment(self, parent: str, rec: Any) -> str:
        t0 = time.perf_counter()
        try:
            return str(self.inner.log_experiment(parent, rec))
        finally:
            self.per_experiment.append(time.perf_counter() - t0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def night(tmp: Path, mode: str, experiments: int, round_: int = 0) -> dict[str, Any]:
    tmp = tmp / f"round-{round_}"
    tmp.mkdir(exist_ok=True)
    target = tmp / f"target-{mode}"
    shutil.copytree(ROOT / "tests/fixtures/fake_target", target)
    extra = "".join(f"EXTRA_{i} = 1.0\n" for i in range(12))  # ideas for a long sweep
    train = target / "train.py"
    train.write_text(train.read_text().replace("SLEEP_S = 0.0", extra + "SLEEP_S = 0.0"))
    init_repo(target)
    store = SqlStore(open_database(tmp / f"{mode}.db"))
    sweep = create_sweep(store, GitRepo(target), target, name=f"bench-{mode}",
                         config=load_config(target), max_experiments=experiments)
    mirror, timed = None, None
    if mode != "none":
        timed = Timed(make_tracker(TrackTable(to=mode, experiment="track-overhead")))
        reads = Reads(store)
        mirror = Mirror(store, TrackMarks(store.engine), track=TrackTable(to=mode),
                        factory=lambda _t: timed,  # type: ignore[arg-type,return-value]
                        light=lambda s: reads.experiment_marks(s.id)).start()
    loop = Loop(store, GitRepo(target), SubprocessRunner(), LoopSettings(tmp / f"work-{mode}"),
                proposer=KnobsProposer(), on_event=mirror.on_event if mirror else None)
    t0 = time.perf_counter()
    run_sweep(loop, sweep.name)
    wall = time.perf_counter() - t0
    t1 = time.perf_counter()
    if mirror is not None:
        mirror.close(timeout_s=120)
    closing = time.perf_counter() - t1
    times = [t for t in Reads(store).timestamps(sweep.id) if t[0] and t[1]]
    gaps = sorted((b[0] - a[1]).total_seconds() for a, b in zip(times, times[1:], strict=False))
    lags: list[float] = []
    if timed is not None:
        ends = {e.id: e.finished_at for e in store.list_experiments(sweep.id)}
        with store.engine.connect() as conn:
            for exp_id, at in conn.exec_driver_sql(
                    "SELECT experiment_id, mirrored_at FROM track_experiments").all():
                mirrored = datetime.fromisoformat(str(at)).replace(tzinfo=UTC)
                if ends.get(exp_id):
                    lags.append((mirrored - ends[exp_id]).total_seconds())
    failing = dict(mirror.status().failing) if mirror else {}
    return {"mode": mode, "n": len(times), "wall": wall, "gaps": gaps, "closing": closing,
            "per": sorted(timed.per_experiment) if timed else [], "lags": sorted(lags),
            "mirrored": len(lags), "errors": list(failing.values())}


def median(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:.0f} ms" if xs else "-"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiments", type=int, default=20)
    ap.add_argument("--modes", nargs="+", default=["none", "mlflow", "wandb"],
                    choices=["none", "mlflow", "wandb"])
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server = None
        if "mlflow" in args.modes:
            (tmp / "mlflow").mkdir()
            server = start_mlflow_server(tmp / "mlflow")
            server.wait_healthy()
            os.environ["MLFLOW_TRACKING_URI"] = server.uri
        os.environ.update(WANDB_MODE="offline", WANDB_DIR=str(tmp), WANDB_SILENT="true")
        try:
            nights = [night(tmp, mode, args.experiments, k) for k in range(args.rounds)
                      for mode in args.modes]
        finally:
            if server is not None:
                server.stop()
    results = []
    for mode in args.modes:
        mine = [r for r in nights if r["mode"] == mode]
        pooled: dict[str, Any] = {"mode": mode, "n": sum(r["n"] for r in mine),
                                  "wall": sum(r["wall"] for r in mine),
                                  "closing": max(r["closing"] for r in mine),
                                  "mirrored": sum(r["mirrored"] for r in mine),
                                  "errors": [e for r in mine for e in r["errors"]]}
        for key in ("gaps", "per", "lags"):
            pooled[key] = sorted(x for r in mine for x in r[key])
        results.append(pooled)
    for r in results:
        p90 = r["gaps"][int(0.9 * (len(r["gaps"]) - 1))] * 1000
        print(f"{r['mode']:>6}: {r['n']} experiments in {r['wall']:.1f} s; gap between runs "
              f"median {median(r['gaps'])}, p90 {p90:.0f} ms; tracker per experiment median "
              f"{median(r['per'])} (its thread); lag median {median(r['lags'])}; close "
              f"{r['closing']:.2f} s (the longest)"
              + (f"; mirrored {r['mirrored']}, errors {r['errors']}" if r["mode"] != "none"
                 else ""))
    print(f"load average {os.getloadavg()[0]:.1f}; command: .venv/bin/python "
          f"benchmarks/track_overhead.py --experiments {args.experiments} --modes "
          f"{' '.join(args.modes)} --rounds {args.rounds}")


if __name__ == "__main__":
    main()
