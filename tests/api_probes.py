"""Probes of the real server shared by tests and benchmarks/containment_api.py: schemathesis
(its CLI, with tests/schemathesis/schemathesis.toml) and bursts of concurrent POSTs."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from service_fixtures import AUTH, TOKEN

ST_CONFIG = Path(__file__).resolve().parent / "schemathesis" / "schemathesis.toml"


def run_schemathesis(url: str, workdir: Path, max_examples: int | None = None,
                     timeout_s: float = 900) -> dict[str, Any]:
    """`st run` with every check against the server at `url`; counts parsed from its summary.

    Returns {"returncode", "cases", "failures", "server_errors", "output"}.
    """
    st = str(Path(sys.executable).with_name("st"))
    argv = [st, "--config-file", str(ST_CONFIG), "run", f"{url}/openapi.json",
            "--checks", "all", "--no-color",
            "--report", "ndjson", "--report-dir", str(workdir / "st-report")]
    if max_examples is not None:
        argv += ["--max-examples", str(max_examples)]
    env = {**os.environ, "OVERNIGHT_TOKEN": TOKEN}
    done = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    out = done.stdout + done.stderr
    generated = re.search(r"(\d+) generated", out)
    failing = re.search(r"(\d+) found (\d+) unique failures", out)
    return {"returncode": done.returncode, "cases": int(generated.group(1)) if generated else 0,
            "failures": int(failing.group(2)) if failing else 0,
            "server_errors": len(re.findall(r"Server error", out)), "output": out}


def post_burst(url: str, bodies: list[dict[str, Any]], workers: int = 64) -> dict[str, Any]:
    """POST every body to /experiments at once (a barrier releases them together).

    Returns {"statuses": {code: n}, "errors": transport errors, "p50_ms", "p99_ms", "ids"}.
    """
    gate = threading.Barrier(min(workers, len(bodies)))
    limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
    times: list[float] = []
    statuses: dict[int, int] = {}
    ids: list[int] = []
    errors = 0
    lock = threading.Lock()
    with httpx.Client(base_url=url, headers=AUTH, timeout=300, limits=limits) as client:
        def post(i: int) -> None:
            nonlocal errors
            if i < workers:
                gate.wait()
            t0 = time.perf_counter()
            try:
                r = client.post("/experiments", json=bodies[i])
            except httpx.TransportError:
                with lock:
                    errors += 1
                return
            with lock:
                times.append((time.perf_counter() - t0) * 1000)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                if r.status_code == 201:
                    ids.append(r.json()["id"])

        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(post, range(len(bodies))))
    times.sort()
    return {"statuses": statuses, "errors": errors, "ids": ids,
            "p50_ms": statistics.median(times) if times else None,
            "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] if times else None}
