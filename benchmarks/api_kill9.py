"""kill -9 the real server again and again mid-run; check nothing is lost or run twice.

Starts `overnight serve` on a fake-trainer target (runs of ~1 s), queues experiments, then
`--kills` times: waits for a run, sleeps a random fraction of a run, SIGKILLs the server and
restarts it (restart recovery runs). Finally lets the queue drain and checks: every finished
experiment ran exactly once (counted by the trainer itself), finished results never changed
across a restart, each interrupted run was re-queued once as a linked row, and the sweep
branch equals the database's best commit.

    .venv/bin/python benchmarks/api_kill9.py [--kills 12] [--experiments 16] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from service_fixtures import kill9_scenario  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=12)
    ap.add_argument("--experiments", type=int, default=16)
    ap.add_argument("--sleep", type=float, default=1.0, help="seconds per training run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        result = kill9_scenario(Path(tmp), kills=args.kills, experiments=args.experiments,
                                sleep_s=args.sleep, seed=args.seed,
                                log=lambda line: print(line, flush=True))
    result.pop("health", None)
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2))
    verdict = "PASS" if not result["problems"] else "FAIL"
    print(f"{verdict}: {result['kills']} kill -9s, {result['runs']} runs, "
          f"{len(result['interrupted'])} interrupted, {len(result['retries'])} followed up, "
          f"{len(result['abandoned'])} given up (crashed: took the service down), "
          f"problems: {len(result['problems'])}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
