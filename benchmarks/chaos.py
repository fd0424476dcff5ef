"""Chaos night: kill -9, a full disk and a frozen service at random moments of every phase.

Serves a fake-trainer sweep (tests/chaos_fixtures.Night) and applies `--per-night` faults per
night drawn at random (seeded) from the kill moments (mid-run, right after a run ends, between
the database recording a keep and the branch moving, during `git worktree add`, during restart
recovery, during and right after POSTs, right after a cancel of a running experiment was
answered), a full disk (the service's files on a small tmpfs, filled to the last page) and a
SIGSTOP/SIGCONT of the service. After each fault: no orphan survives the restart, recovery leaves
no row `running` that the dead service left so, no finished result changed. At the end of each
night: every accepted proposal ends in exactly one verdict, an answered cancel ends `cancelled`
and never runs again, nothing ran twice, the branch equals the recorded best, every run died
within its limit. Nights follow each other until `--kills` kills are reached.

The tmpfs needs root (or a kernel that lets this user mount); without it the full-disk fault is
skipped and the report says why.

    .venv/bin/python benchmarks/chaos.py [--kills 100] [--per-night 30] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from chaos_fixtures import FAULTS, KILL_MOMENTS, Night  # noqa: E402

# How often each fault is drawn: kills at every moment, the disk and the freeze now and then.
WEIGHTS = {**{m: 3 for m in KILL_MOMENTS}, "mid_run": 4, "disk_full": 2, "freeze": 1}


def plan(rng_seed: int, n: int, only: list[str] | None = None) -> list[str]:
    """n faults, each class (of `only`, default all) at least once, the rest by WEIGHTS."""
    import random

    rng = random.Random(rng_seed)
    kinds = only or list(FAULTS)
    faults = list(kinds)
    while len(faults) < n:
        faults += rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])
    rng.shuffle(faults)
    return faults


def night(seed: int, faults: int, tmp: Path, only: list[str] | None) -> dict[str, object]:
    n = Night(tmp, seed=seed, strict_limits=True,
              log=lambda line: print(f"  [{seed}] {line}", flush=True))
    try:
        n.open()
        for i, fault in enumerate(plan(seed, faults, only)):
            n.fault(fault)
            if i % 5 == 4:
                print(f"  [{seed}] {i + 1} faults, {n.kills} kills, problems so far: "
                      f"{len(n.problems)}", flush=True)
        return n.finish()
    finally:
        n.close()


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=100, help="kill -9s to reach (at least)")
    ap.add_argument("--per-night", type=int, default=30, help="faults per night")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", help=f"comma-separated faults to draw from: {','.join(FAULTS)}")
    args = ap.parse_args()
    only = args.only.split(",") if args.only else None
    if only and set(only) - set(FAULTS):
        ap.error(f"unknown faults: {sorted(set(only) - set(FAULTS))}")
    # A TERM (or an INT in the background) unwinds like a ^C: each night's close() stops its
    # service and unmounts its tmpfs.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupted)
    started = time.monotonic()
    nights, kills, seed = [], 0, args.seed
    moments: Counter[str] = Counter()
    while kills < args.kills or not nights:
        with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
            result = night(seed, args.per_night, Path(tmp), only)
        print(json.dumps(result, indent=2), flush=True)
        nights.append(result)
        kills += int(result["kills"])  # type: ignore[call-overload]
        moments.update(result["faults"])  # type: ignore[arg-type]
        seed += 1
    problems = [p for r in nights for p in r["problems"]]  # type: ignore[attr-defined]
    summary = {"nights": len(nights), "kills": kills, "faults": dict(moments),
               "experiments": sum(int(r["experiments"]) for r in nights),  # type: ignore
               "trainer_runs": sum(int(r["trainer_runs"]) for r in nights),  # type: ignore
               "accepted": sum(int(r["accepted"]) for r in nights),  # type: ignore
               "given_up": sum(len(r["given_up"]) for r in nights),  # type: ignore
               "cancels": sum(len(r["cancelled"]) for r in nights),  # type: ignore
               "longest_trainer_s": max(float(r["longest_trainer_s"]) for r in nights),  # type: ignore
               "disk": nights[0]["disk"], "problems": problems,
               "wall_s": round(time.monotonic() - started, 1)}
    print(json.dumps(summary, indent=2))
    print(f"{'PASS' if not problems else 'FAIL'}: {kills} kill -9s over {len(nights)} "
          f"night(s), faults {dict(moments)}, failures: {len(problems)}")
    return 0 if not problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
