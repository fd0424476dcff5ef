"""Hostile-client figures for the real server (issue 9, parts 4-5): schemathesis cases and
server errors; 1,000 concurrent distinct POST /experiments (rows, errors, p50/p99); 50 identical
concurrent POSTs (rows created; the target is exactly 1).

    .venv/bin/python benchmarks/containment_api.py [--distinct 1000] [--identical 50]
                                                  [--no-schemathesis] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from api_probes import post_burst, run_schemathesis  # noqa: E402
from service_fixtures import ServerProcess, knob_diff, make_counting_target  # noqa: E402


def _sweep(server: ServerProcess, target: Path, name: str) -> None:
    """A paused sweep (nothing runs: the figures are the API's alone)."""
    with server.client() as c:
        r = c.post("/sweeps", json={"name": name, "target": str(target), "paused": True,
                                    "proposer": "queue"})
        r.raise_for_status()


def _rows(server: ServerProcess, description: str | None = None) -> int:
    with server.client() as c:
        page = c.get("/experiments", params={"sweep": "b", "status": "queued", "limit": 200})
        if description is None:
            return int(page.json()["count"]) - 1  # minus the baseline
        return sum(e["description"] == description for e in page.json()["data"])


def measure(distinct: int, identical: int, schemathesis: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        target = make_counting_target(Path(tmp) / "target", n_knobs=max(distinct, 1))
        server = ServerProcess(Path(tmp) / "o.db", log=Path(tmp) / "server.log", slots=0).start()
        try:
            if schemathesis:  # on sweep "s" (tests/schemathesis/schemathesis.toml names it)
                _sweep(server, target, "s")
                st = run_schemathesis(server.url, Path(tmp))
                out["schemathesis"] = {k: st[k] for k in ("cases", "failures", "server_errors",
                                                          "returncode")}
            _sweep(server, target, "b")
            bodies = [{"sweep": "b", "description": f"K{k} = 1",
                       "diff": knob_diff(target, k, 1)} for k in range(distinct)]
            burst = post_burst(server.url, bodies, workers=64)
            out["distinct"] = {"posts": distinct, "rows": _rows(server),
                               "statuses": burst["statuses"], "errors": burst["errors"],
                               "p50_ms": round(burst["p50_ms"], 1),
                               "p99_ms": round(burst["p99_ms"], 1)}
            same = {"sweep": "b", "description": "K0 = -1", "diff": knob_diff(target, 0, -1)}
            burst = post_burst(server.url, [same] * identical, workers=identical)
            out["identical"] = {"posts": identical, "rows": _rows(server, "K0 = -1"),
                                "statuses": burst["statuses"], "errors": burst["errors"]}
            out["server_tracebacks"] = server.tail(100_000_000).count("Traceback")
        finally:
            server.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--distinct", type=int, default=1000)
    ap.add_argument("--identical", type=int, default=50)
    ap.add_argument("--no-schemathesis", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = measure(args.distinct, args.identical, not args.no_schemathesis)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if "schemathesis" in result:
        st = result["schemathesis"]
        print(f"schemathesis: {st['cases']} cases, {st['failures']} failures, "
              f"{st['server_errors']} server errors")
    d, i = result["distinct"], result["identical"]
    print(f"{d['posts']} concurrent distinct POSTs: {d['rows']} rows, statuses {d['statuses']}, "
          f"{d['errors']} transport errors, p50 {d['p50_ms']} ms, p99 {d['p99_ms']} ms")
    print(f"{i['posts']} concurrent identical POSTs: {i['rows']} row(s) created, "
          f"statuses {i['statuses']}")
    print(f"server tracebacks: {result['server_tracebacks']}")
    ok = i["rows"] == 1 and d["rows"] == d["posts"] and result["server_tracebacks"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
