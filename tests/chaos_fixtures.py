"""The chaos night: `overnight serve` under faults at every phase, and the invariants after each.

Used by tests/test_chaos.py (one fault of each kind) and benchmarks/chaos.py (100+ kills). Built
on service_fixtures (the counting target, ServerProcess, check_invariants, live_orphans).

Faults (`Night.fault(name)`):
- kill -9 of the service at a moment of each class in KILL_MOMENTS: mid-run; right after a run
  ends (its summary is in the log, the service has not recorded it yet or just did); between the
  database recording a keep and the branch moving; during `git worktree add`; during restart
  recovery itself (twice in a row: a kill, then one in the recovery of the restart); during a
  burst of POSTs; right after a POST was answered; right after a cancel of a running
  experiment was answered (202).
- `disk_full`: the service's database, work dir (logs, worktrees) and target repository live on a
  small tmpfs, which is filled to its last page while a run is in flight and freed a few seconds
  later (sometimes with a kill -9 while full, and a restart while still full).
- `freeze`: SIGSTOP of the service while a hung run is in flight, for longer than the run's
  limit, then SIGCONT.

The git moments are made exact by a `git` shim first on the service's PATH: while
<chaos>/hold-<name> exists it stops before that command (after touching at-<name>), and exits
without running it once its caller died, so a killed service never moves a branch after the fact.

Checked after each fault: no orphaned process group, and no trainer started before a kill
alive after the restart; no row the dead service left `running` still `running` once the
restart recovered; finished results seen before it unchanged. At the end: every accepted
(2xx) proposal ends in exactly one verdict (through its retry chain), a POST whose answer was
lost made at most one; a change whose cancel was answered ends `cancelled`, not re-queued
and not started again; nothing ran twice (the trainer's own (experiment, seed) starts against
the run records); the branch equals the recorded best; every trainer died within its limit.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from service_fixtures import (
    FINISHED_RUNS,
    ServerProcess,
    all_experiments,
    branch_head,
    check_invariants,
    given_up,
    idle,
    knob_diff,
    live_orphans,
    make_counting_target,
    read_run_log,
    run_records,
    wait_for,
)

KILL_MOMENTS = ("mid_run", "after_run", "keep_to_branch", "worktree_add", "recovery",
                "during_posts", "after_post", "after_cancel")
# Kills that come with another fault (not drawn on their own): while the disk is full.
OTHER_KILLS = ("while_full",)
FAULTS = (*KILL_MOMENTS, "disk_full", "freeze")
VERDICTS = (*FINISHED_RUNS, "rejected", "cancelled")
SWEEP = "chaos"
GRACE_S = 5.0  # `overnight serve`'s grace (api.settings.Settings.grace_s)
LIFETIME_SLACK_S = 2.0  # the watcher's polling and a busy machine's scheduling
HANG_S = 600.0
N_KNOBS = 400
LOG_PAD = 6000  # bytes the trainer logs per step: its log needs new pages as it grows

SHIM = """#!/bin/bash
# chaos shim: holds chosen git commands while $CHAOS_DIR/hold-<name> exists
name=""
case " $* " in
  *" update-ref -m overnight: keep "*) name=keep ;;
  *" worktree add "*) name=worktree-add ;;
  *" worktree prune"*) name=worktree-prune ;;
esac
if [ -n "$name" ] && [ -e "$CHAOS_DIR/hold-$name" ]; then
  parent=$PPID
  touch "$CHAOS_DIR/at-$name"
  while [ -e "$CHAOS_DIR/hold-$name" ]; do
    kill -0 "$parent" 2>/dev/null || exit 1
    sleep 0.02
  done
fi
exec {git} "$@"
"""


def mount_tmpfs(where: Path, size_mb: int) -> str | None:
    """Mount a tmpfs of `size_mb` at `where` (root, or a kernel that lets us); None when
    mounted, else why not."""
    where.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700",
                               "tmpfs", str(where)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run mount: {exc}"
    return None if done.returncode == 0 else (done.stderr.strip() or "mount failed")


def fill(folder: Path) -> Path:
    """Fill the filesystem of `folder` to its last page; the filler file."""
    filler = folder / "filler"
    with open(filler, "ab", buffering=0) as fh:
        for chunk in (1 << 20, 1 << 12):
            with contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * chunk)
    return filler


class Lifetimes:
    """Watches every trainer the runs file names (pid, start time) until it is gone."""

    def __init__(self, runs_file: Path, poll_s: float = 0.05) -> None:
        self.runs_file, self.poll_s = runs_file, poll_s
        self.started: dict[int, float] = {}  # pid -> its start (wall clock)
        self.ended: dict[int, float] = {}
        self._seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="lifetimes")
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def poll(self) -> None:
        if self.runs_file.is_file():
            lines = self.runs_file.read_text().splitlines()
            for line in lines[self._seen:]:
                fields = line.split()
                if len(fields) >= 4:
                    self.started.setdefault(int(fields[2]), float(fields[3]))
            self._seen = len(lines)
        now = time.time()
        for pid in list(self.started):
            if pid not in self.ended and not _alive(pid):
                self.ended[pid] = now

    def alive_since_before(self, when: float) -> list[int]:
        self.poll()
        return [p for p, t in self.started.items() if t < when and p not in self.ended]

    def longest(self) -> float:
        self.poll()
        now = time.time()
        return max((self.ended.get(p, now) - t for p, t in self.started.items()), default=0.0)

    def over(self, limit_s: float) -> list[str]:
        self.poll()
        now = time.time()
        return [f"trainer {p} lived {self.ended.get(p, now) - t:.1f} s (limit {limit_s:g} s)"
                for p, t in self.started.items() if self.ended.get(p, now) - t > limit_s]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _state(pid: int) -> str | None:
    """The process's state letter (R, S, T, Z, ...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rpartition(b")")[2].split()[0].decode()
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z", "X")


class Night:
    """One sweep served under faults; `fault(name)` applies one, `finish()` judges the night."""

    def __init__(self, tmp: Path, *, seed: int = 0, sleep_s: float = 1.0, timeout_s: float = 4.0,
                 disk_mb: int | None = 64, strict_limits: bool = False,
                 log: Callable[[str], None] | None = None) -> None:
        self.tmp, self.rng, self.sleep_s, self.timeout_s = tmp, random.Random(seed), sleep_s, \
            timeout_s
        said = log or (lambda _line: None)
        self.say = lambda line: said(f"{time.strftime('%H:%M:%S')} {line}")
        self.limit_s = timeout_s + 2 * GRACE_S + 1.0  # runner.process: the reaper's backstop
        # A trainer that outlives this is a failure: the limit and the watcher's slack (the
        # benchmark), or twice the limit (the tests: no figure of a busy machine's speed).
        self.lifetime_cap_s = self.limit_s + LIFETIME_SLACK_S if strict_limits else \
            2 * self.limit_s
        self.disk = tmp / "disk"
        self.no_disk = mount_tmpfs(self.disk, disk_mb) if disk_mb else "no tmpfs asked for"
        self.mounted = self.no_disk is None
        self.chaos = tmp / "chaos"
        self.chaos.mkdir(parents=True, exist_ok=True)
        shim = self.chaos / "bin" / "git"
        shim.parent.mkdir()
        shim.write_text(SHIM.format(git=shutil.which("git")))
        shim.chmod(0o755)
        self.runs_file = tmp / "runs.txt"
        self.target = make_counting_target(self.disk / "target", sleep_s=sleep_s, n_knobs=N_KNOBS,
                                           pad=LOG_PAD)
        self.db = self.disk / "o.db"
        self.work = self.disk / "o.db.work"
        env = {"FAKE_RUN_LOG": str(self.runs_file), "CHAOS_DIR": str(self.chaos),
               "PATH": f"{shim.parent}:{os.environ.get('PATH', '')}"}
        self.server = ServerProcess(self.db, log=tmp / "server.log", env=env, poll_s=0.05)
        self.lifetimes = Lifetimes(self.runs_file)
        self.accepted: dict[int, str] = {}  # id -> description, for every 2xx POST
        self.unanswered: list[str] = []  # descriptions of POSTs whose answer was lost
        self.seen_finished: dict[int, Any] = {}
        self.done: Counter[str] = Counter()  # faults (and kill moments) applied
        self.skipped: Counter[str] = Counter()
        self.kills = 0
        self.problems: list[str] = []
        self.knob = 0
        self.filler: Path | None = None
        self.frozen: dict[int, str] = {}  # hung experiment -> its verdict after a freeze
        self.left_running: set[int] = set()  # rows a killed service left `running`
        self.cancels: dict[int, float] = {}  # experiment -> when its cancel was answered

    def open(self) -> Night:
        """Start the service and create the sweep (close() undoes it, also after a failure)."""
        self.server.start(timeout_s=120)
        with self.client() as c:
            r = c.post("/sweeps", json={"name": SWEEP, "target": str(self.target),
                                        "proposer": "queue", "budget_s": self.sleep_s,
                                        "timeout_s": self.timeout_s})
            assert r.status_code == 201, r.text
            # Faults start once the baseline is in: four kills of its runs in a row would pause
            # the sweep for its owner to look at (by design), which no night here wants.
            wait_for(lambda: c.get("/experiments/1").json()["status"] == "kept", 300,
                     "the baseline to be kept")
        return self

    # --- helpers --------------------------------------------------------------------------
    def client(self, timeout_s: float = 30.0) -> httpx.Client:
        return self.server.client(timeout=timeout_s)

    def next_diff(self, hang: bool = False, better: bool | None = None) -> tuple[str, str]:
        """(description, diff) of a change no other touches: K<i> = ±1, or a hung run."""
        k = self.knob
        self.knob += 1
        assert k < N_KNOBS, "the night ran out of knobs"
        value = (1 if better else -1) if better is not None else self.rng.choice((1, -1))
        diff = knob_diff(self.target, k, value)
        if not hang:
            return f"K{k} = {value}", diff
        base = _committed(self.target)
        line = f"K{k} = 0  # knobs: skip"
        new = base.replace(line, f"K{k} = {value}  # knobs: skip", 1).replace(
            "HANG_S = 0.0  # knobs: skip", f"HANG_S = {HANG_S}  # knobs: skip", 1)
        return f"K{k} = {value}, hang", _unified(base, new)

    def post(self, c: httpx.Client, hang: bool = False, priority: int = 0,
             better: bool | None = None) -> httpx.Response:
        description, diff = self.next_diff(hang, better)
        try:
            r = c.post("/experiments", json={"sweep": SWEEP, "description": description,
                                              "diff": diff, "priority": priority})
        except httpx.TransportError:
            self.unanswered.append(description)
            raise
        if r.is_success:
            self.accepted[r.json()["id"]] = description
        return r

    def feed(self, queued: int = 3) -> None:
        """Keep `queued` experiments waiting, so every fault finds work."""
        with self.client() as c:
            page = c.get("/experiments", params={"status": "queued", "limit": 1}).json()
            for _ in range(max(queued - page["count"], 0)):
                r = self.post(c)
                assert r.status_code == 201, r.text

    def running(self, c: httpx.Client) -> list[int]:
        return [e["id"] for e in c.get("/experiments", params={"status": "running"}).json()
                ["data"]]

    def snapshot(self, c: httpx.Client) -> None:
        """Remember every finished result (they must never change)."""
        for e in all_experiments(c):
            if e["status"] in VERDICTS:
                self.seen_finished.setdefault(e["id"], (e["status"], e["metric"]))

    def kill(self, moment: str) -> float:
        """kill -9 the service; the moment's class is counted; the kill's time."""
        self.server.kill9()
        self.left_running |= db_running(self.db)
        self.kills += 1
        self.done[moment] += 1
        self.say(f"kill {self.kills}: {moment}")
        return time.time()

    def restart(self, killed_at: float) -> None:
        """Start again (recovery runs first) and check what a restart must leave."""
        self.server.start(timeout_s=120)
        self.after_restart(killed_at)

    def after_restart(self, killed_at: float) -> None:
        orphans = live_orphans(self.db)
        if orphans:
            self.problems.append(f"process groups alive after a restart: {orphans}")
        try:
            wait_for(lambda: not self.lifetimes.alive_since_before(killed_at), 15,
                     "trainers from before the kill to be gone")
        except AssertionError:
            left = self.lifetimes.alive_since_before(killed_at)
            self.problems.append(f"trainers started before a kill alive after it: {left}")
        with self.client() as c:
            left = sorted(self.left_running)
            self.expect(lambda: not [i for i in left if c.get(f"/experiments/{i}").json()
                                     ["status"] == "running"], 60,
                        f"recovery to end the rows a dead service left running: {left}")
            self.left_running.clear()
            now = {e["id"]: e for e in all_experiments(c)}
        for exp_id, was in self.seen_finished.items():
            e = now.get(exp_id)
            if e is None or (e["status"], e["metric"]) != was:
                self.problems.append(f"finished result {exp_id} changed across a restart: "
                                     f"{was} -> {e and (e['status'], e['metric'])}")

    def hold(self, name: str) -> Path:
        (self.chaos / f"at-{name}").unlink(missing_ok=True)
        (self.chaos / f"hold-{name}").touch()
        return self.chaos / f"at-{name}"

    def release(self, name: str) -> None:
        (self.chaos / f"hold-{name}").unlink(missing_ok=True)
        (self.chaos / f"at-{name}").unlink(missing_ok=True)

    # --- faults -----------------------------------------------------------------------------
    def fault(self, name: str, **how: Any) -> None:
        """Apply one fault of FAULTS (feeding the queue first); `how`: its options."""
        if name == "disk_full" and not self.mounted:
            self.skipped[name] += 1
            return
        self.feed()
        getattr(self, f"_{name}")(**how)
        if name not in KILL_MOMENTS:
            self.done[name] += 1

    def _mid_run(self) -> None:
        with self.client() as c:
            wait_for(lambda: self.running(c), 120, "a running experiment", poll_s=0.02)
            time.sleep(self.rng.uniform(0.0, self.sleep_s * 1.2))
            self.snapshot(c)
        self.restart(self.kill("mid_run"))

    def _after_run(self) -> None:
        """Kill as soon as a run's summary is in its log (its end not recorded yet, or just):
        the log of any experiment seen running since, as a run that ran out of time on a busy
        machine, or was stopped early, writes none and the next experiment runs instead."""
        logs = self.work / "logs" / SWEEP
        with self.client() as c:
            seen = set(wait_for(lambda: self.running(c), 120, "a running experiment",
                                poll_s=0.02))
            self.snapshot(c)
            looked = [time.monotonic()]

            def summary_written() -> bool:
                if time.monotonic() - looked[0] > 0.2:  # which experiments run now
                    seen.update(self.running(c))
                    looked[0] = time.monotonic()
                for path in (p for i in seen for pattern in (f"{i}.log", f"{i}.run*.log")
                             for p in logs.glob(pattern)):
                    with contextlib.suppress(OSError):
                        if "num_steps:" in path.read_text(errors="replace"):
                            return True
                return False

            wait_for(summary_written, 120, "a run's summary", poll_s=0.005)
        self.restart(self.kill("after_run"))

    def _at_git(self, name: str, moment: str, ask: Callable[[httpx.Client], None]) -> None:
        """Kill while the service's `git <name>` is held by the shim."""
        at = self.hold(name)
        try:
            with self.client() as c:
                ask(c)
                self.snapshot(c)
                wait_for(at.exists, 180, f"the service to reach git {name}", poll_s=0.01)
                self.snapshot(c)
            killed = self.kill(moment)
        finally:
            self.release(name)
        self.restart(killed)
        if moment == "keep_to_branch":
            self.check_branch("after a kill between a keep and the branch move")

    def _keep_to_branch(self) -> None:
        self._at_git("keep", "keep_to_branch",
                     lambda c: self.post(c, priority=5, better=True).raise_for_status())

    def _worktree_add(self) -> None:
        self._at_git("worktree-add", "worktree_add", lambda c: None)

    def _recovery(self) -> None:
        """A kill mid-run, then another one during the restart's recovery (held in its worktree
        prune, or at a random moment of the start)."""
        with self.client() as c:
            wait_for(lambda: self.running(c), 120, "a running experiment", poll_s=0.02)
            time.sleep(self.rng.uniform(0.0, self.sleep_s))
            self.snapshot(c)
        first = self.kill("mid_run")
        at = self.hold("worktree-prune")
        try:
            self.server.launch()
            if self.rng.random() < 0.5:
                wait_for(at.exists, 120, "recovery's git worktree prune", poll_s=0.01)
            else:
                time.sleep(self.rng.uniform(0.2, 2.0))
            self.kill("recovery")
        finally:
            self.release("worktree-prune")
        self.restart(first)

    def _during_posts(self) -> None:
        stop = threading.Event()

        def burst() -> None:
            with self.client(timeout_s=10) as c:
                while not stop.is_set():
                    try:
                        self.post(c)
                    except httpx.TransportError:
                        return

        with self.client() as c:
            self.snapshot(c)
        posting = threading.Thread(target=burst, daemon=True)
        posting.start()
        time.sleep(self.rng.uniform(0.05, 0.8))
        killed = self.kill("during_posts")
        stop.set()
        posting.join(30)
        self.restart(killed)

    def _after_post(self) -> None:
        with self.client() as c:
            self.snapshot(c)
            r = self.post(c)
        killed = self.kill("after_post")
        assert r.status_code == 201, r.text
        self.restart(killed)

    def _after_cancel(self) -> None:
        """Cancel a running experiment and kill -9 as soon as the answer (202) is in."""
        with self.client() as c:
            for _ in range(20):
                ids = wait_for(lambda: self.running(c), 120, "a running experiment",
                               poll_s=0.02)
                time.sleep(self.rng.uniform(0.0, self.sleep_s * 0.8))
                self.snapshot(c)
                r = c.delete(f"/experiments/{ids[0]}")
                if r.status_code in (200, 202):
                    self.cancels[ids[0]] = time.time()
                    break
                if r.status_code != 409:  # 409: it finished first; try the next one
                    self.problems.append(f"a cancel of running {ids[0]} got {r.status_code}: "
                                         f"{r.text[:200]}")
                    return
            else:
                self.problems.append("20 cancels in a row found their run finished")
                return
        self.restart(self.kill("after_cancel"))

    def _disk_full(self, end: str | None = None, restart_full: bool | None = None) -> None:
        """Fill the disk while a run is in flight; /health must say so and POSTs get a 503;
        free it; the engine goes on by itself. Before the free, `end`: "kill" (kill -9), "stop"
        (a clean stop, SIGTERM) or "" (neither); `restart_full`: then a restart while still
        full. Drawn at random when None."""
        with self.client() as c:
            wait_for(lambda: self.running(c), 120, "a running experiment", poll_s=0.02)
            time.sleep(self.rng.uniform(0.0, self.sleep_s))
            self.snapshot(c)
            self.filler = fill(self.disk)
            self.say("disk full")
            self.expect(lambda: c.get("/health").json().get("writes_failing_since"), 120,
                        "/health to say writes fail on a full disk")
            r = c.post("/experiments", json={"sweep": SWEEP, "description": "while full",
                                              "diff": self.next_diff()[1]})
            if r.is_success:
                self.accepted[r.json()["id"]] = "while full"
            elif r.status_code != 503:
                self.problems.append(f"a POST while the disk was full got {r.status_code}: "
                                     f"{r.text[:200]}")
            time.sleep(self.rng.uniform(0.5, 3.0))
        if end is None:
            end = self.rng.choices(["", "kill", "stop"], weights=[5, 3, 2])[0]
        killed = self.kill("while_full") if end == "kill" else time.time()
        if end == "stop":  # runs end, and what cannot be recorded is left to recovery
            code = self.server.stop(timeout_s=60)
            self.done["stop_while_full"] += 1
            self.say("stopped while full")
            if code not in (0, -signal.SIGTERM):
                self.problems.append(f"a clean stop on a full disk ended with {code}")
        if restart_full is None:
            restart_full = self.rng.random() < 0.5
        kill = bool(end)
        if kill and restart_full:  # a restart while still full: up, writes failing
            self.say("restart while full")
            self.server.start(timeout_s=120)
            with self.client() as c:  # what a restart finds: writes fail, or this one works
                r = c.post("/experiments", json={"sweep": SWEEP, "description": "full start",
                                                  "diff": self.next_diff()[1]})
                if r.is_success:
                    self.accepted[r.json()["id"]] = "full start"
                elif r.status_code != 503:
                    self.problems.append(f"a POST after a start on a full disk got "
                                         f"{r.status_code}: {r.text[:200]}")
                elif not c.get("/health").json().get("writes_failing_since"):
                    self.problems.append("/health said writes succeed after a 503 no_space")
        self.free()
        if kill and self.server.proc is not None and self.server.proc.poll() is not None:
            self.restart(killed)
        elif kill:
            self.after_restart(killed)
        with self.client() as c:
            self.expect(lambda: not c.get("/health").json().get("writes_failing_since"), 180,
                        "/health to say writes succeed once the disk was freed")
            before = c.get("/experiments", params={"status": "queued", "limit": 1}).json()
            self.expect(lambda: c.get("/experiments", params={"status": "queued", "limit": 1})
                        .json()["count"] < before["count"] or idle(c), 180,
                        "the engine to go on by itself once the disk was freed")

    def expect(self, predicate: Callable[[], Any], timeout_s: float, what: str) -> bool:
        """Wait for `predicate`; a problem (not an exception) when it does not come."""
        try:
            wait_for(predicate, timeout_s, what, poll_s=0.1)
        except AssertionError:
            self.problems.append(f"timed out after {timeout_s:g} s waiting for {what}")
            return False
        return True

    def free(self) -> None:
        if self.filler is not None:
            self.filler.unlink(missing_ok=True)
            self.filler = None
            self.say("disk freed")

    def _freeze(self) -> None:
        """SIGSTOP the service while a hung run is in flight until that run is dead: it must
        die while the service is still frozen (its own supervisor keeps the limit), then
        SIGCONT; the thawed service gives it its verdict."""
        with self.client() as c:
            r = self.post(c, hang=True, priority=9)
            assert r.status_code == 201, r.text
            hung = r.json()["id"]
            wait_for(lambda: self.trainer_of(hung), 180, "the hung run to start", poll_s=0.02)
            self.snapshot(c)
        proc = self.server.proc
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
        self.say("service frozen")
        try:
            pid = self.trainer_of(hung)
            dead = self.expect(lambda: pid in self.lifetimes.ended, 4 * self.limit_s,
                               f"the hung run of experiment {hung} to die while the service "
                               "was frozen")
            if dead and _state(proc.pid) != "T":
                self.problems.append("the service was not frozen when its run died")
        finally:
            proc.send_signal(signal.SIGCONT)
        with self.client() as c:
            wait_for(lambda: c.get(f"/experiments/{hung}").json()["status"] in VERDICTS, 180,
                     "the hung run's verdict")
            self.frozen[hung] = c.get(f"/experiments/{hung}").json()["status"]

    def trainer_of(self, exp_id: int) -> int | None:
        """The pid of the latest trainer started for `exp_id` (None before it started)."""
        pids = [int(f[2]) for f in (line.split() for line in self.runs_file.read_text()
                                    .splitlines()) if len(f) >= 4 and int(f[0]) == exp_id] \
            if self.runs_file.is_file() else []
        self.lifetimes.poll()
        return pids[-1] if pids else None

    # --- the judgement ------------------------------------------------------------------------
    def check_branch(self, when: str) -> None:
        with self.client() as c:
            best = c.get(f"/sweeps/{SWEEP}").json()["best_commit"]
        head = branch_head(self.target, f"overnight/{SWEEP}")
        if best and head != best:
            self.problems.append(f"{when}: branch at {head[:7]}, the recorded best {best[:7]}")

    def finish(self) -> dict[str, Any]:
        """Drain the queue, stop the service, check every invariant; the night's figures."""
        self.free()
        with self.client() as c:
            wait_for(lambda: idle(c), 600, "the queue to drain", poll_s=0.2)
            exps = all_experiments(c)
            best = c.get(f"/sweeps/{SWEEP}").json()["best_commit"]
        self.server.stop()
        runs = read_run_log(self.runs_file)
        head = branch_head(self.target, f"overnight/{SWEEP}")
        self.problems += check_invariants(exps, runs, self.seen_finished, head, best,
                                          run_records(self.db),
                                          run_records(self.db, interrupted=True))
        self.problems += verdict_problems(exps, self.accepted, self.unanswered)
        self.problems += cancel_problems(exps, self.cancels, read_run_starts(self.runs_file))
        self.problems += self.lifetimes.over(self.lifetime_cap_s)
        if "Traceback" in self.server.tail(10_000_000):
            self.problems.append("a traceback in the service's log")
        statuses = Counter(e["status"] for e in exps)
        by_id = {e["id"]: e for e in exps}
        return {"kills": self.kills, "faults": dict(self.done), "skipped": dict(self.skipped),
                "experiments": len(exps), "accepted": len(self.accepted),
                "unanswered_posts": len(self.unanswered), "statuses": dict(statuses),
                "trainer_runs": len(runs), "longest_trainer_s": round(self.lifetimes.longest(), 1),
                "limit_s": self.limit_s, "frozen": self.frozen,
                "cancelled": {i: by_id[i]["status"] for i in self.cancels if i in by_id},
                "given_up": [e["id"] for e in exps if given_up(e)],
                "problems": self.problems,
                "disk": "tmpfs" if self.mounted else f"none ({self.no_disk})"}

    def close(self) -> None:
        self.lifetimes.close()
        self.free()
        if self.server.proc is not None and self.server.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.server.proc.send_signal(signal.SIGCONT)
            self.server.stop()
        if self.mounted:
            if os.environ.get("CHAOS_KEEP"):  # for a post-mortem: the service's files
                shutil.copytree(self.disk, self.tmp / "kept", dirs_exist_ok=True)
            subprocess.run(["umount", "-l", str(self.disk)], capture_output=True, timeout=60)


def verdict_problems(exps: list[dict[str, Any]], accepted: dict[int, str],
                     unanswered: list[str]) -> list[str]:
    """Every accepted proposal ends in exactly one verdict (its retry chain's last row); a POST
    whose answer was lost left at most one proposal."""
    by_id = {e["id"]: e for e in exps}
    retry = {(e.get("meta") or {}).get("retry_of"): e for e in exps}
    problems = []
    for exp_id, description in accepted.items():
        e, hops = by_id.get(exp_id), 0
        while e is not None and e["status"] == "interrupted" and hops < 100:
            e, hops = retry.get(e["id"]), hops + 1
        if e is None or e["status"] not in VERDICTS:
            problems.append(f"accepted proposal {exp_id} ({description}) has no verdict: "
                            f"{e and e['status']}")
    firsts = Counter(e["description"] for e in exps if not (e.get("meta") or {}).get("retry_of"))
    problems += [f"a lost POST ({d}) made {firsts[d]} proposals" for d in unanswered
                 if firsts[d] > 1]
    return problems


def cancel_problems(exps: list[dict[str, Any]], cancels: dict[int, float],
                    starts: list[tuple[int, float]]) -> list[str]:
    """A change whose cancel was answered (200/202) ends `cancelled`: no retry row, and no
    trainer of it started after the answer (`starts`: (experiment, start time))."""
    by_id = {e["id"]: e for e in exps}
    retried = {(e.get("meta") or {}).get("retry_of") for e in exps}
    problems = []
    for exp_id, answered in cancels.items():
        status = by_id.get(exp_id, {}).get("status")
        if status != "cancelled":
            problems.append(f"experiment {exp_id} was cancelled (answered) but ended {status}")
        if exp_id in retried:
            problems.append(f"cancelled experiment {exp_id} was re-queued")
        if any(e == exp_id and t > answered for e, t in starts):
            problems.append(f"cancelled experiment {exp_id} started again after its cancel")
    return problems


def read_run_starts(runs_file: Path) -> list[tuple[int, float]]:
    """(experiment, start time) of every trainer start the fake trainer logged."""
    if not runs_file.is_file():
        return []
    return [(int(f[0]), float(f[3])) for f in (line.split() for line in
                                                runs_file.read_text().splitlines())
            if len(f) >= 4]


def db_running(db: Path) -> set[int]:
    """Ids of the rows the database has `running` (read straight from the file)."""
    from agent.core.domain import ExperimentStatus
    from db.engine import open_database
    from db.store import SqlStore

    engine = open_database(db)
    try:
        return {e.id for e in SqlStore(engine).list_experiments(
            statuses=[ExperimentStatus.RUNNING])}
    finally:
        engine.dispose()


def _committed(target: Path) -> str:
    return subprocess.run(["git", "show", "HEAD:train.py"], cwd=target, check=True,
                          capture_output=True, text=True).stdout


def _unified(old: str, new: str) -> str:
    import difflib

    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                        "a/train.py", "b/train.py"))
