"""Null changes through the real loop: how many does each keep rule keep?

The noisy fake trainer (tests/scripts/noisy_trainer.py: metric = 1.0 + N(0, 0.05), seeded by
OVERNIGHT_SEED and its IDEA knob) gets `--proposals` changes that only move IDEA, so none has
a true effect. Each sweep runs through the real loop (git worktrees, subprocesses, SQLite) with
default settings; `--seeds` sweeps per rule, each with another `seed` in overnight.toml.

    .venv/bin/python benchmarks/null_sweep.py [--proposals 20] [--seeds 3]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from agent.core.config import load_config
from agent.core.domain import ExperimentStatus
from agent.engine.loop import Loop, LoopSettings
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo, init_repo
from agent.ops.sweeps import create_sweep
from db.engine import open_database
from db.store import SqlStore

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from foreground import run_sweep  # noqa: E402  (tests/: one sweep in the foreground)
from null_proposer import Ideas  # noqa: E402  (tests/: the null-change proposer)

TOML = """[target]
command   = "python train.py"
editable  = ["train.py"]
protected = ["overnight.toml"]
metric    = "val_bpb"
budget_s  = 0.2
timeout_s = 30
seed      = {seed}
decision  = "{decision}"
"""


def one_sweep(root: Path, decision: str, seed: int, proposals: int) -> tuple[int, int]:
    """(null changes kept, runs) of one sweep."""
    target = root / f"{decision}-{seed}"
    target.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "scripts" / "noisy_trainer.py", target / "train.py")
    (target / "overnight.toml").write_text(TOML.format(seed=seed, decision=decision))
    init_repo(target)
    store = SqlStore(open_database(root / f"{decision}-{seed}.db"))
    repo = GitRepo(target)
    sweep = create_sweep(store, repo, target, name="null", config=load_config(target),
                         max_experiments=proposals)
    loop = Loop(store, repo, SubprocessRunner(grace_s=0.5), LoopSettings(root / "work"),
                proposer=Ideas())  # type: ignore[arg-type]
    run_sweep(loop, sweep.name)
    exps = store.list_experiments(sweep.id)
    kept = sum(e.status is ExperimentStatus.KEPT and not e.is_baseline for e in exps)
    return kept, len(store.list_runs(sweep_id=sweep.id))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proposals", type=int, default=20)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="null-sweep-"))
    try:
        for decision in ("strict", "sequential"):
            results = [one_sweep(root, decision, 100 + s, args.proposals)
                       for s in range(args.seeds)]
            kept = [k for k, _ in results]
            runs = sum(r for _, r in results)
            print(f"{decision:<11} null changes kept per sweep: {kept} (of {args.proposals}); "
                  f"{runs / (args.seeds * args.proposals):.2f} runs per proposal")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
