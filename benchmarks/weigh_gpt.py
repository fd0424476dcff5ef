"""Constraints and simplicity through the real loop on the gpt target (experiments/gpt, on CPU).

A fresh copy of the target gets `simplicity_margin` and a memory ceiling in its overnight.toml
(committed, as a user would), then a night of two proposals through `run_foreground` (the
engine `overnight run` uses: real git worktrees, real subprocesses, a SQLite file):

1. `D_MODEL` 128 -> 512: a larger model whose peak memory passes the ceiling, `peak_memory_mb
   <= 1.2 x incumbent` (on CPU train.py prints its peak RSS): it should be discarded over a
   bound, whatever its loss;
2. delete the SwiGLU branch of the MLP, which `USE_SWIGLU = False` never runs (a component
   with no effect): it should be kept as a simplification.

    .venv/bin/python benchmarks/weigh_gpt.py                   # 20 steps a run, 1 thread
    .venv/bin/python benchmarks/weigh_gpt.py --margin 0.1 --steps 40

Prints each experiment's verdict and what it weighed; exits 1 when either does not end so.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import git

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.analysis.words import weighed  # noqa: E402
from agent.core.budget import ComputeBudget  # noqa: E402
from agent.core.domain import ExperimentStatus, Proposal  # noqa: E402
from agent.core.record import Ending  # noqa: E402
from agent.git.repo import IDENTITY  # noqa: E402
from agent.proposers.knobs import make_diff  # noqa: E402
from db.engine import open_database  # noqa: E402
from db.store import SqlStore  # noqa: E402
from overnight.cli import run_foreground  # noqa: E402
from overnight.cli_setup import TEMPLATES, init_target  # noqa: E402

CEILING = "<= 1.2 x incumbent"


def without_swiglu(text: str) -> str:
    """train.py with the SwiGLU branches (and the knob) removed: what USE_SWIGLU = False ran."""
    out = re.sub(r"^USE_SWIGLU = .*\n", "", text, flags=re.M)
    out = out.replace(
        "        if USE_SWIGLU:\n            hidden = (2 * hidden // 3 + 63) // 64 * 64\n"
        "            self.c_fc = nn.Linear(D_MODEL, 2 * hidden, bias=False)\n        else:\n"
        "            self.c_fc = nn.Linear(D_MODEL, hidden, bias=False)\n",
        "        self.c_fc = nn.Linear(D_MODEL, hidden, bias=False)\n")
    out = out.replace(
        "        if USE_SWIGLU:\n            a, b = h.chunk(2, dim=-1)\n"
        "            h = F.silu(a) * b\n        else:\n            h = F.relu(h).square()\n",
        "        h = F.relu(h).square()\n")
    if "USE_SWIGLU" in out:
        raise SystemExit("train.py's SwiGLU branch is not as this benchmark expects")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--margin", type=float, default=0.2, help="simplicity_margin (val_bpb)")
    ap.add_argument("--dir", type=Path, default=None, help="where the target and db go")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="weigh-gpt-"))
    target = root / "target"
    init_target(TEMPLATES / "gpt", target)
    toml = target / "overnight.toml"
    text = toml.read_text()
    text = text.replace("[target]\n", f"[target]\nsimplicity_margin = {args.margin}\n", 1)
    toml.write_text(text + f'\n[target.constraints]\npeak_memory_mb = "{CEILING}"\n')
    git.Repo(target).git.commit("-am", "memory ceiling, simplicity margin", env=IDENTITY)
    train = (target / "train.py").read_text()
    changes = [  # the wide model first: discarded, it leaves the head where the other applies
        Proposal("D_MODEL 128 -> 512", make_diff(
            "train.py", train, train.replace("D_MODEL = 128", "D_MODEL = 512")), "manual"),
        Proposal("remove the SwiGLU branch (unused)",
                 make_diff("train.py", train, without_swiglu(train)), "manual"),
    ]
    db = root / "overnight.db"
    t0 = time.perf_counter()
    done = run_foreground(str(db), target, sweep_name="weigh-gpt", experiments=len(changes),
                          budget=ComputeBudget(args.steps, "steps"), proposer="knobs",
                          device="cpu", quiet=True,
                          runs_on={"extra_env": {"OMP_NUM_THREADS": "1"}}, proposals=changes)
    store = SqlStore(open_database(db))
    exps = store.list_experiments(done.id)
    print(f"\n{len(store.list_runs(sweep_id=done.id))} runs in {time.perf_counter() - t0:.0f} s "
          f"({args.steps} steps a run, 1 thread; simplicity_margin {args.margin}, "
          f"peak_memory_mb {CEILING}); db {db}")
    ok = True
    for e in exps:
        rec = e.record
        print(f"#{e.id} {e.status.value:<9} {e.description}\n    {e.reason}")
        note = weighed(rec, args.margin, minimize=True)
        if note:
            print(f"    weighed: {note}")
    simpler = next(e for e in exps if e.description.startswith("remove the SwiGLU"))
    wide = next(e for e in exps if e.description.startswith("D_MODEL"))
    if simpler.status is not ExperimentStatus.KEPT or simpler.record is None or \
            not simpler.record.simpler:
        print("the simplification was not kept as one")
        ok = False
    if wide.record is None or wide.record.ending is not Ending.OVER_BOUND:
        print("the wide model was not discarded over the memory bound")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
