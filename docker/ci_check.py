"""The image check's API part (docker/ci.sh): wait for /health, create a sweep on the mounted
target, queue one experiment, wait for its verdict and print it. Standard library only.

    python3 docker/ci_check.py URL TARGET_IN_CONTAINER DIFF_FILE CONTAINER

The token is $OVERNIGHT_TOKEN. Every wait ends on the container's state: it stops at once when
the container exits, and a bound (the arguments' --*-s) only keeps a hung service from hanging CI.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

FINISHED = {"kept", "discarded", "crashed", "timeout", "rejected", "cancelled", "interrupted"}
VERDICTS = {"kept", "discarded"}  # a decided experiment; anything else fails the check
POLL_S = 0.5


class CheckFailed(Exception):
    pass


def call(url: str, token: str, method: str = "GET", body: dict[str, Any] | None = None,
         ) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            ctype = r.headers.get("content-type", "")
            return r.status, json.loads(raw) if "json" in ctype else raw.decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def running(container: str) -> bool:
    out = subprocess.run(["podman", "inspect", "-f", "{{.State.Running}}", container],
                         capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() == "true"


def wait(what: str, probe: Any, container: str, bound_s: float) -> Any:
    """Poll `probe` until it returns a value other than None; fail when the container is gone
    or after bound_s."""
    give_up = time.monotonic() + bound_s
    while True:
        value = probe()
        if value is not None:
            return value
        if not running(container):
            raise CheckFailed(f"the container stopped while waiting for {what}")
        if time.monotonic() > give_up:
            raise CheckFailed(f"no {what} after {bound_s:.0f} s")
        time.sleep(POLL_S)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("target", help="the target's path inside the container")
    ap.add_argument("diff_file", help="the experiment's unified diff against the target's HEAD")
    ap.add_argument("container")
    ap.add_argument("--health-s", type=float, default=120)
    ap.add_argument("--verdict-s", type=float, default=300)
    args = ap.parse_args()
    token = os.environ.get("OVERNIGHT_TOKEN", "")
    if not token:
        raise CheckFailed("OVERNIGHT_TOKEN is not set")
    url = args.url.rstrip("/")

    def health() -> Any:
        try:
            code, body = call(f"{url}/health", token)
        except OSError:  # not listening yet
            return None
        return body if code == 200 else None

    print(f"health: {json.dumps(wait('/health', health, args.container, args.health_s))}")

    code, sweep = call(f"{url}/sweeps", token, "POST", {
        "name": "ci", "target": args.target, "proposer": "queue", "budget_s": 5})
    if code != 201:
        raise CheckFailed(f"POST /sweeps answered {code}: {sweep}")
    print(f"sweep: {sweep['name']} on {sweep['target']} ({sweep['budget']} per run)")
    with open(args.diff_file) as f:
        diff = f.read()
    code, exp = call(f"{url}/experiments", token, "POST", {
        "sweep": "ci", "description": "learning rate 0.1", "diff": diff})
    if code != 201:
        raise CheckFailed(f"POST /experiments answered {code}: {exp}")
    exp_id = exp["id"]
    print(f"experiment {exp_id}: {exp['status']}")

    def finished() -> Any:
        code, body = call(f"{url}/experiments/{exp_id}", token)
        if code != 200:
            raise CheckFailed(f"GET /experiments/{exp_id} answered {code}: {body}")
        return body if body["status"] in FINISHED else None

    done = wait(f"experiment {exp_id}'s verdict", finished, args.container, args.verdict_s)
    code, sweep = call(f"{url}/sweeps/ci", token)
    print(f"baseline val_loss: {sweep.get('baseline_metric')}")
    print(f"verdict: experiment {exp_id} {done['status']}: val_loss {done['metric']}, "
          f"delta {done['delta']}, reason: {done['reason']}")
    if done["status"] not in VERDICTS:
        code, log = call(f"{url}/experiments/{exp_id}/log", token)
        raise CheckFailed(f"experiment {exp_id} ended {done['status']} "
                          f"({done['crash_kind']}: {done['crash_cause']}); its log:\n{log}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CheckFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
