"""Where a POST /experiments spends the server's CPU: a cProfile (thread CPU time) of the
real app under uvicorn in this process, its event-loop thread and every admission worker,
while a client process sends `--posts` distinct proposals with `--in-flight` outstanding.

Prints the CPU per POST of each part: the event loop (HTTP parsing, middleware, pydantic
validation, response building), and in the admission worker the sweep read, the duplicate
lookup, git (the parent's side; the git child's own CPU is measured from /proc), the insert
and the response's experiment. Then the top functions by own time.

    .venv/bin/python benchmarks/post_profile.py [--posts 1000] [--in-flight 100] [--top 25]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pickle
import pstats
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from post_rate import burst, request_bytes  # noqa: E402
from service_fixtures import TOKEN, knob_diff, make_counting_target  # noqa: E402

# (label, function names whose cumulative time is that part) — read from the worker profile.
PARTS = [
    ("sweep read (get_sweep)", ("get_sweep",)),
    ("admission checks in Python (check_proposal, clean_description)",
     ("check_proposal", "clean_description")),
    ("duplicate lookup (has_diff)", ("has_diff",)),
    ("git apply --cached, parent side (tree_changes)", ("tree_changes",)),
    ("insert + counts + commit (add_experiment)", ("add_experiment",)),
]


def child_cpu_s() -> float:
    """CPU seconds of this process's waited-for children (the git processes)."""
    t = os.times()
    return t.children_user + t.children_system


def client(url: str, requests_file: str, in_flight: int) -> None:
    requests = pickle.loads(Path(requests_file).read_bytes())
    out = asyncio.run(burst(url, requests, in_flight))
    own = os.times()
    print(f"client: {len(out['times'])} answers {out['statuses']} in {out['wall_s']:.2f} s")
    print(f"client cpu s: {own.user + own.system}")


def profiled(profiles: list[cProfile.Profile], work: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        prof = cProfile.Profile(time.thread_time)
        prof.enable()
        try:
            return work()
        finally:
            prof.disable()
            profiles.append(prof)
    return run


def cumulative(stats: pstats.Stats, names: tuple[str, ...]) -> float:
    """Cumulative seconds of the outermost calls of functions named `names`."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    return sum(ct for (_, _, fn), (_cc, _nc, _tt, ct, _callers) in raw.items() if fn in names)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--posts", type=int, default=1000)
    ap.add_argument("--in-flight", type=int, default=100)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        main_prof, workers, state = profile_server(args, Path(tmp))
    report(args, main_prof, workers, state)
    return 0


def profile_server(args: Any, tmp: Path) -> tuple[cProfile.Profile, list[cProfile.Profile],
                                                   dict[str, float]]:
    """Serve the real app here, profiled, while `drive` sends the POSTs from a client process."""
    import uvicorn

    from api.settings import Settings
    from overnight.cli_service import _bind
    from overnight.runtime import service_app

    target = make_counting_target(tmp / "target", n_knobs=args.posts)
    settings = Settings.build(db_path=tmp / "o.db", host="127.0.0.1", port=0, slots=0,
                              token=TOKEN, run_scheduler=False)
    app = service_app(settings)
    services = app.state.services
    workers: list[cProfile.Profile] = []
    gate_run = services.admissions.run

    async def run(sweep: str, work: Callable[[], Any]) -> Any:
        return await gate_run(sweep, profiled(workers, work))

    services.admissions.run = run
    sock = _bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    state: dict[str, float] = {}
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    threading.Thread(target=drive, args=(server, url, target, args, workers, state, tmp),
                     daemon=True).start()
    main_prof = cProfile.Profile(time.thread_time)
    main_prof.enable()
    server.run(sockets=[sock])
    main_prof.disable()
    return main_prof, workers, state


def drive(server: Any, url: str, target: Path, args: Any, workers: list[cProfile.Profile],
          state: dict[str, float], tmp: Path) -> None:
    """Make the sweep, then run the client process; the git children's CPU into `state`."""
    import httpx

    while not server.started:
        time.sleep(0.05)
    httpx.post(f"{url}/sweeps", headers={"Authorization": f"Bearer {TOKEN}"},
               json={"name": "s0", "target": str(target), "paused": True, "proposer": "queue"},
               timeout=60).raise_for_status()
    host = url.split("//", 1)[1]
    reqs = tmp / "requests.pickle"
    reqs.write_bytes(pickle.dumps([request_bytes(host, {
        "sweep": "s0", "description": f"K{k} = 1", "diff": knob_diff(target, k, 1)})
        for k in range(args.posts)]))
    del workers[:]
    git0 = child_cpu_s()
    done = subprocess.run([sys.executable, __file__, "--client", url, str(reqs),
                           str(args.in_flight)], check=True, capture_output=True,
                          text=True).stdout
    print(done.splitlines()[0])
    client_s = float(done.split("client cpu s: ", 1)[1].split()[0])
    state["git"] = child_cpu_s() - git0 - client_s  # the client is a waited-for child too
    server.should_exit = True


def report(args: Any, main_prof: cProfile.Profile, workers: list[cProfile.Profile],
           state: dict[str, float]) -> None:
    n = len(workers)
    ws = pstats.Stats(workers[0])
    for p in workers[1:]:
        ws.add(p)
    loop_s = pstats.Stats(main_prof).total_tt  # type: ignore[attr-defined]
    worker_s = ws.total_tt  # type: ignore[attr-defined]
    print(f"{n} POSTs profiled (thread CPU time, cProfile overhead included)")
    print(f"  event loop thread (HTTP, middleware, pydantic, response; set-up included): "
          f"{loop_s * 1000 / n:.2f} ms")
    print(f"  admission worker thread: {worker_s * 1000 / n:.2f} ms, of which:")
    for label, names in PARTS:
        print(f"    {label}: {cumulative(ws, names) * 1000 / n:.2f} ms")
    print(f"  git child processes: {state['git'] * 1000 / n:.2f} ms")
    out = io.StringIO()
    pstats.Stats(workers[0], stream=out).add(*workers[1:]).sort_stats("tottime").print_stats(
        args.top)
    print("--- worker threads, by own time ---")
    print(out.getvalue()[-12000:])
    out = io.StringIO()
    pstats.Stats(main_prof, stream=out).sort_stats("tottime").print_stats(args.top)
    print("--- event loop thread, by own time ---")
    print(out.getvalue()[-12000:])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        raise SystemExit(0)
    raise SystemExit(main())
