"""POST /experiments at agent speed (issue 14 part 2): throughput and p50/p99 of `--posts`
distinct proposals with `--in-flight` requests outstanding, against the real server on loopback.

Starts `overnight serve` (no slots: nothing runs, the figures are the API's) on a fresh
database with `--sweeps` paused sweeps on as many git targets, then keeps `--in-flight`
keep-alive connections busy until every proposal is answered. The client is a few lines of
asyncio over raw HTTP/1.1 (one process, no threads), so on a small machine its own CPU stays
out of the server's way. Also printed: the server's CPU per POST (its process and the git
children it waited for), which a busy machine inflates far less than latency.

    .venv/bin/python benchmarks/post_rate.py [--posts 1000] [--in-flight 100] [--sweeps 1]
                                             [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from service_fixtures import TOKEN, ServerProcess, knob_diff, make_counting_target  # noqa: E402


def pct(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted values (nearest rank)."""
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def cpu_s(pid: int) -> float:
    """CPU seconds of a process and its waited-for children (utime+stime+cutime+cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def request_bytes(host: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    head = (f"POST /experiments HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
    return head.encode() + data


async def read_response(reader: asyncio.StreamReader) -> int:
    """One HTTP/1.1 response with a Content-Length; its status code."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines
                  if line.lower().startswith("content-length:"))
    await reader.readexactly(length)
    return int(lines[0].split()[1])


async def burst(url: str, requests: list[bytes], in_flight: int) -> dict[str, Any]:
    """Send every request over `in_flight` connections; statuses, latencies, wall seconds."""
    host_port = url.split("//", 1)[1]
    host, port = host_port.rsplit(":", 1)
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for req in requests:
        queue.put_nowait(req)
    times: list[float] = []
    statuses: dict[int, int] = {}

    async def worker() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while not queue.empty():
                req = queue.get_nowait()
                t0 = time.perf_counter()
                writer.write(req)
                code = await read_response(reader)
                times.append(time.perf_counter() - t0)
                statuses[code] = statuses.get(code, 0) + 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return {"wall_s": time.perf_counter() - t0, "times": sorted(times), "statuses": statuses}


def measure(posts: int, in_flight: int, sweeps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        per_sweep = -(-posts // sweeps)
        targets = [make_counting_target(Path(tmp) / f"target{i}", n_knobs=per_sweep)
                   for i in range(sweeps)]
        server = ServerProcess(Path(tmp) / "o.db", log=Path(tmp) / "server.log", slots=0).start()
        try:
            with server.client() as c:
                for i, target in enumerate(targets):
                    c.post("/sweeps", json={"name": f"s{i}", "target": str(target),
                                            "paused": True, "proposer": "queue"}
                           ).raise_for_status()
            host = server.url.split("//", 1)[1]
            requests = [request_bytes(host, {"sweep": f"s{k % sweeps}",
                                             "description": f"K{k // sweeps} = 1",
                                             "diff": knob_diff(targets[k % sweeps],
                                                               k // sweeps, 1)})
                        for k in range(posts)]
            assert server.proc is not None
            cpu0 = cpu_s(server.proc.pid)
            out = asyncio.run(burst(server.url, requests, in_flight))
            cpu = cpu_s(server.proc.pid) - cpu0
            with server.client() as c:
                queued = c.get("/experiments", params={"status": "queued", "limit": 1}
                               ).json()["count"] - sweeps  # minus the baselines
            tracebacks = server.tail(100_000_000).count("Traceback")
        finally:
            server.stop()
    times = out["times"]
    return {"posts": posts, "in_flight": in_flight, "sweeps": sweeps,
            "statuses": out["statuses"], "rows": queued,
            "per_s": round(len(times) / out["wall_s"], 1), "wall_s": round(out["wall_s"], 2),
            "p50_ms": round(pct(times, 0.5) * 1000, 1), "p99_ms": round(pct(times, 0.99) * 1000, 1),
            "server_cpu_ms_per_post": round(cpu * 1000 / posts, 2),
            "server_tracebacks": tracebacks, "load_avg_1m": os.getloadavg()[0]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--posts", type=int, default=1000)
    ap.add_argument("--in-flight", type=int, default=100)
    ap.add_argument("--sweeps", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = measure(args.posts, args.in_flight, args.sweeps)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print(f"{r['posts']} distinct POST /experiments, {r['in_flight']} in flight, "
              f"{r['sweeps']} sweep(s): {r['per_s']}/s ({r['wall_s']} s), p50 {r['p50_ms']} ms, "
              f"p99 {r['p99_ms']} ms; statuses {r['statuses']}, {r['rows']} rows queued; "
              f"server CPU {r['server_cpu_ms_per_post']} ms/POST; load avg {r['load_avg_1m']:.1f}")
    ok = r["rows"] == r["posts"] and r["statuses"] == {201: r["posts"]}
    return 0 if ok and r["server_tracebacks"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
