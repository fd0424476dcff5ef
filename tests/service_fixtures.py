"""Helpers for the service tests and benchmarks: a counting fake target, diffs, a real server.

The target is the fake trainer with independent knobs K0..K{n-1}: metric = score(LR, WIDTH,
USE_TRICK) - 0.001 * sum(K). Setting Ki to 1 is always an improvement, to -1 always worse, and
diffs on different Ki never conflict, so many can be queued at once. HANG_S > 0 makes a run
hang that long before its summary (a run for its time limit to end); PAD > 0 logs that many
filler bytes after each progress line (a log that needs new space as it grows). Each run appends its
OVERNIGHT_EXPERIMENT_ID, OVERNIGHT_SEED, pid and start time to $FAKE_RUN_LOG when it starts (to
count run starts, and to watch how long each lived).
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from agent.git.repo import init_repo

ROOT = Path(__file__).resolve().parent.parent
FAKE_TARGET = ROOT / "tests" / "fixtures" / "fake_target"
TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
N_KNOBS = 300
_FILLER = 7  # lines between knobs, so hunks on different knobs never share context

TRAIN_TEMPLATE = '''"""Fake trainer for service tests: metric = score(...) - 0.001 * sum(K)."""

import os
import re
import sys
import time

from prepare import score

_RUN_LOG = os.environ.get("FAKE_RUN_LOG")
if _RUN_LOG:
    with open(_RUN_LOG, "a") as fh:
        fh.write(os.environ.get("OVERNIGHT_EXPERIMENT_ID", "?") + " "
                 + os.environ.get("OVERNIGHT_SEED", "?")
                 + f" {{os.getpid()}} {{time.time():.3f}}\\n")

LR = 0.01  # best at 0.04
WIDTH = 64  # best at 256
USE_TRICK = False  # True helps by 0.05
SLEEP_S = {sleep}  # knobs: skip
HANG_S = 0.0  # knobs: skip
PAD = {pad}  # knobs: skip
{hang_filler}
{knobs}
K_SUM = sum(v for k, v in dict(globals()).items() if re.fullmatch(r"K\\d+", k))

budget = float(os.environ.get("OVERNIGHT_BUDGET_S", "1"))
start = time.time()
for step in range(1, 4):
    elapsed = time.time() - start
    print(f"step {{step}} | loss {{5.0 / step:.4f}} | elapsed {{elapsed:.2f}}s", flush=True)
    if PAD:
        print("#" * PAD, flush=True)
    time.sleep(min(SLEEP_S, budget) / 3)
time.sleep(HANG_S)
value = score(LR, WIDTH, USE_TRICK) - 0.001 * K_SUM
print("---")
print(f"val_bpb:          {{value:.6f}}")
print(f"training_seconds: {{time.time() - start:.1f}}")
print("peak_memory_mb:   2048.0")
print("num_steps:        3")
'''


def train_source(sleep_s: float = 0.0, n_knobs: int = N_KNOBS, pad: int = 0) -> str:
    knobs = []
    for i in range(n_knobs):
        knobs.append(f"K{i} = 0  # knobs: skip")
        knobs += [f"# filler {i}.{j}" for j in range(_FILLER)]
    hang_filler = "\n".join(f"# hang filler {j}" for j in range(_FILLER))
    return TRAIN_TEMPLATE.format(sleep=float(sleep_s), knobs="\n".join(knobs),
                                 hang_filler=hang_filler, pad=pad)


def make_counting_target(dest: Path, sleep_s: float = 0.0, n_knobs: int = N_KNOBS,
                         pad: int = 0) -> Path:
    """A git target whose runs are counted and last about `sleep_s` (capped by the budget);
    `pad`: bytes of filler the trainer logs after each progress line."""
    shutil.copytree(FAKE_TARGET, dest, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "train.py").write_text(train_source(sleep_s, n_knobs, pad))
    (dest / ".gitignore").write_text("__pycache__/\n")
    toml = dest / "overnight.toml"  # a run sees FAKE_RUN_LOG only because the target asks
    toml.write_text(toml.read_text() + 'pass_env  = ["FAKE_RUN_LOG"]\n')
    init_repo(dest)
    return dest


def knob_diff(target: Path, knob: int, value: int, base: str | None = None) -> str:
    """A unified diff setting K<knob> to `value` against the committed train.py."""
    old = base if base is not None else _committed_train(target)
    line = f"K{knob} = 0  # knobs: skip"
    assert line in old, f"K{knob} not in train.py"
    new = old.replace(line, f"K{knob} = {value}  # knobs: skip", 1)
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        "a/train.py", "b/train.py"))


def _committed_train(target: Path) -> str:
    return subprocess.run(["git", "show", "HEAD:train.py"], cwd=target, check=True,
                          capture_output=True, text=True).stdout


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)


def read_run_log(path: Path) -> list[tuple[int, int]]:
    """(experiment id, seed) of every run start, in order."""
    if not path.is_file():
        return []
    fields = (line.split() for line in path.read_text().splitlines() if line.strip())
    return [(int(f[0]), int(f[1])) for f in fields]


def run_records(db: Path | str, interrupted: bool = False) -> dict[int, int]:
    """How many run records each experiment has in the database: those that ended by
    themselves, or (`interrupted`) those cut off too (their process may not have started)."""
    from agent.core.domain import RunStatus
    from db.engine import open_database
    from db.store import SqlStore

    engine = open_database(db)
    try:
        counts: dict[int, int] = {}
        for r in SqlStore(engine).list_runs():
            if interrupted or r.status is not RunStatus.INTERRUPTED:
                counts[r.experiment_id] = counts.get(r.experiment_id, 0) + 1
        return counts
    finally:
        engine.dispose()


class ServerProcess:
    """`overnight serve` in a subprocess on an ephemeral loopback port."""

    def __init__(self, db: Path | str, *, log: Path, env: dict[str, str] | None = None,
                 slots: int = 1, poll_s: float = 0.1, extra: list[str] | None = None) -> None:
        self.db, self.log_path = db, log
        self.env = {**os.environ, "OVERNIGHT_TOKEN": TOKEN, **(env or {})}
        cli = str(Path(sys.executable).with_name("overnight"))
        self.argv = [cli, "serve", "--db", str(db), "--port", "0",
                     "--slots", str(slots), "--poll", str(poll_s),
                     "--log-level", "warning", *(extra or [])]
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def launch(self) -> int:
        """Start the process without waiting for it; the log's size before it (its offset)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as fh:
            self.proc = subprocess.Popen(self.argv, stdout=fh, stderr=subprocess.STDOUT,
                                         env=self.env, cwd=ROOT)
        return offset

    def start(self, timeout_s: float = 30.0) -> ServerProcess:
        offset = self.launch()

        def started() -> str | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            text = self.log_path.read_text(errors="replace")[offset:]
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", text)
            return m.group(1) if m else None

        self.url = wait_for(started, timeout_s, "the server to bind", poll_s=0.05)

        def healthy() -> bool:
            started()  # raises if the server died during start-up (recovery, lock)
            try:
                return httpx.get(f"{self.url}/health", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, timeout_s, "the server to answer /health", poll_s=0.05)
        return self

    def client(self, **kw: Any) -> httpx.Client:
        kw.setdefault("timeout", 30.0)
        return httpx.Client(base_url=self.url, headers=AUTH, **kw)

    def tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


# --- the kill -9 scenario (used by tests/test_service_server.py and benchmarks/api_kill9.py) ---
FINISHED_RUNS = ("kept", "discarded", "crashed", "timeout")


def all_experiments(client: httpx.Client) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 200, **({"cursor": cursor} if cursor else {})}
        page = client.get("/experiments", params=params).json()
        out += page["data"]
        cursor = page["next_cursor"]
        if not cursor:
            return out


def idle(client: httpx.Client) -> bool:
    page = client.get("/experiments", params=[("status", "queued"), ("status", "running"),
                                              ("limit", 1)]).json()
    return page["count"] == 0


def given_up(exp: dict[str, Any]) -> bool:
    """The verdict of a change that was running each time the service died, past the cap: its
    record's ending (agent.rules.endings.gave_up), not its reason's words."""
    record = (exp.get("meta") or {}).get("verdict") or {}
    return exp["status"] == "crashed" and record.get("ending") == "gave up"


def check_invariants(exps: list[dict[str, Any]], runs: list[tuple[int, int]],
                     before: dict[int, Any], branch_head: str, best_commit: str | None,
                     records: dict[int, int], cut_off: dict[int, int] | None = None
                     ) -> list[str]:
    """Everything a kill -9 must not break; returns the problems found (empty: all good).

    `runs` are the (experiment, seed) starts the trainer logged; `records` the run records per
    experiment in the database. No (experiment, seed) may run twice, and every finished
    experiment ran exactly as often as it has (non-interrupted) run records, or, given
    `cut_off` (its records, interrupted ones included: an incumbent re-run of a best
    experiment cut off by a kill belongs to it), at most that often.
    """
    problems = []
    pairs: dict[tuple[int, int], int] = {}
    counts: dict[int, int] = {}
    for r in runs:
        pairs[r] = pairs.get(r, 0) + 1
        counts[r[0]] = counts.get(r[0], 0) + 1
    by_id = {e["id"]: e for e in exps}
    problems += [f"experiment {i} ran seed {s} {n} times" for (i, s), n in pairs.items() if n > 1]
    for e in exps:
        n, want = counts.get(e["id"], 0), records.get(e["id"], 0)
        most = want if cut_off is None else cut_off.get(e["id"], 0)
        if given_up(e):  # a verdict row recovery wrote: it never ran itself
            problems += given_up_problems(e, by_id, n + most, cut_off, records)
        elif e["status"] in FINISHED_RUNS and (n < 1 or not want <= n <= most):
            problems.append(f"finished experiment {e['id']} ran {n} times, {want} run records"
                            + (f" ({most} with those cut off)" if most != want else ""))
        if e["status"] in ("queued", "running"):
            problems.append(f"experiment {e['id']} still {e['status']}")
        retry_of = (e.get("meta") or {}).get("retry_of")
        if retry_of is not None and by_id.get(retry_of, {}).get("status") != "interrupted":
            problems.append(f"retry {e['id']} of a non-interrupted experiment {retry_of}")
    retried = {(e.get("meta") or {}).get("retry_of") for e in exps}
    for e in exps:
        if e["status"] == "interrupted" and e["id"] not in retried:  # a retry, or a verdict
            problems.append(f"interrupted experiment {e['id']} was not followed up")
    for exp_id, (status, metric) in before.items():
        now = by_id.get(exp_id)
        if now is None or (now["status"], now["metric"]) != (status, metric):
            problems.append(f"finished result {exp_id} changed: {(status, metric)} -> "
                            f"{now and (now['status'], now['metric'])}")
    if best_commit and branch_head != best_commit:
        problems.append(f"branch at {branch_head[:7]} but the DB best is {best_commit[:7]}")
    return problems


def given_up_problems(e: dict[str, Any], by_id: dict[int, dict[str, Any]], own_runs: int,
                      cut_off: dict[int, int] | None, records: dict[int, int]) -> list[str]:
    """A change given up (`crashed`, "took the service down") ran nothing itself, and (given
    `cut_off`) more than MAX_CRASH_RETRIES rows of its retry chain before it had a run cut off."""
    from agent.rules.endings import MAX_CRASH_RETRIES

    problems = [f"given-up verdict {e['id']} ran itself"] if own_runs else []
    if cut_off is None:
        return problems
    cut, hops = 0, 0
    row = by_id.get((e.get("meta") or {}).get("retry_of"))
    while row is not None and hops < 100:
        cut += cut_off.get(row["id"], 0) > records.get(row["id"], 0)
        row, hops = by_id.get((row.get("meta") or {}).get("retry_of")), hops + 1
    if cut <= MAX_CRASH_RETRIES:
        problems.append(f"experiment {e['id']} given up after {cut} cut-off runs of its chain")
    return problems


def live_orphans(db: Path | str) -> list[int]:
    """Process groups recorded for interrupted experiments and runs (confirmation and incumbent
    runs included) that are still alive (should be none)."""
    from agent.core.domain import ExperimentStatus, RunStatus
    from db.engine import open_database
    from db.store import SqlStore
    from runner.groups import process_group_alive

    engine = open_database(db)
    try:
        store = SqlStore(engine)
        exps = store.list_experiments(statuses=[ExperimentStatus.INTERRUPTED])
        runs = [r for r in store.list_runs() if r.status is RunStatus.INTERRUPTED]
        groups = {e.pgid for e in exps} | {r.pgid for r in runs}
        return sorted(g for g in groups if g and process_group_alive(g))
    finally:
        engine.dispose()


def branch_head(target: Path, branch: str) -> str:
    return subprocess.run(["git", "rev-parse", f"refs/heads/{branch}"], cwd=target,
                          capture_output=True, text=True, check=True).stdout.strip()


def kill9_scenario(tmp: Path, kills: int, experiments: int, sleep_s: float = 1.2,
                   seed: int = 0, log: Callable[[str], None] | None = None,
                   db: str | None = None) -> dict[str, Any]:
    """Serve, queue `experiments` knob changes, kill -9 the server `kills` times at random
    moments while something runs, restart each time, let it finish; check the invariants.
    `db`: a postgresql:// URL (worktrees and logs then in `tmp/work`); default a SQLite file."""
    import random

    rng = random.Random(seed)
    target = make_counting_target(tmp / "target", sleep_s=sleep_s, n_knobs=max(experiments, 1))
    runs_file = tmp / "runs.txt"
    database = db or str(tmp / "o.db")
    server = ServerProcess(database, log=tmp / "server.log", env={"FAKE_RUN_LOG": str(runs_file)},
                           poll_s=0.05, extra=["--work-dir", str(tmp / "work")] if db else None
                           ).start()
    killed_during: list[int] = []
    done_kills = 0
    seen_finished: dict[int, Any] = {}  # every finished result seen before any kill
    with server.client() as c:
        r = c.post("/sweeps", json={"name": "k9", "target": str(target), "proposer": "queue",
                                    "budget_s": max(sleep_s, 1), "timeout_s": 60})
        assert r.status_code == 201, r.text
        for k in range(experiments):
            r = c.post("/experiments", json={"sweep": "k9", "description": f"K{k}",
                                              "diff": knob_diff(target, k, rng.choice((1, -1)))})
            assert r.status_code == 201, r.text
    for i in range(kills):
        with server.client() as c:
            def running() -> list[int]:
                page = c.get("/experiments", params={"status": "running"}).json()
                return [e["id"] for e in page["data"]] or (idle(c) and [-1])  # type: ignore

            now_running = wait_for(running, 60, "a running experiment", poll_s=0.02)
            if now_running == [-1]:
                break  # everything finished before this kill
            time.sleep(rng.uniform(0.0, sleep_s * 1.3))  # anywhere in (or just after) the run
            before = {e["id"]: (e["status"], e["metric"]) for e in all_experiments(c)
                      if e["status"] in FINISHED_RUNS}
        seen_finished.update(before)
        server.kill9()
        done_kills += 1
        killed_during += now_running
        if log:
            log(f"kill {i + 1}: server killed while experiment(s) {now_running} ran")
        server.start()
        orphans = live_orphans(database)
        assert not orphans, f"training process groups alive after restart: {orphans}"
        with server.client() as c:
            after = {e["id"]: e for e in all_experiments(c)}
        changed = [k for k, v in before.items() if (after[k]["status"], after[k]["metric"]) != v]
        assert not changed, f"finished results changed across a restart: {changed}"
    with server.client() as c:
        wait_for(lambda: idle(c), 30 + experiments * (sleep_s + 1), "the queue to drain")
        exps = all_experiments(c)
        sweep = c.get("/sweeps/k9").json()
        health = c.get("/health").json()
    server.stop()
    runs = read_run_log(runs_file)
    head = branch_head(target, "overnight/k9")
    # results recorded before a kill must be unchanged at the end (not compared with themselves)
    problems = check_invariants(exps, runs, seen_finished, head, sweep["best_commit"],
                                run_records(database), run_records(database, interrupted=True))
    statuses: dict[str, int] = {}
    for e in exps:
        statuses[e["status"]] = statuses.get(e["status"], 0) + 1
    return {"kills": done_kills, "killed_during": killed_during,
            "statuses": statuses, "runs": len(runs), "problems": problems,
            "interrupted": [e["id"] for e in exps if e["status"] == "interrupted"],
            "retries": {e["meta"]["retry_of"]: e["id"] for e in exps
                        if (e.get("meta") or {}).get("retry_of")},
            "abandoned": [e["id"] for e in exps if given_up(e)],
            "branch_ok": head == sweep["best_commit"], "health": health,
            "checked_before_kills": len(seen_finished)}
