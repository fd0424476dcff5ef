"""The real trackers for the tracking tests: an MLflow server on loopback (its own sqlite file and
artifact folder, started once per session, waited on through /health), what MLflow and W&B's
offline run files hold of a sweep read back into one shape, and the check that compares those
numbers with overnight's records (`overnight results --format json`, the store)."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

BIN = Path(sys.executable).parent
# Nothing leaves the machine: no usage telemetry from MLflow (its client and the server the
# fixture starts inherit this), no error reports from W&B.
for _name, _value in (("MLFLOW_DISABLE_TELEMETRY", "true"), ("DO_NOT_TRACK", "true"),
                      ("WANDB_ERROR_REPORTING", "false")):
    os.environ.setdefault(_name, _value)


@dataclass
class MlflowServer:
    uri: str
    log: Path
    proc: subprocess.Popen[bytes]

    def wait_healthy(self, timeout_s: float = 240) -> None:
        """Until /health answers 200 (or the server dies: its log in the error)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited {self.proc.returncode}:\n"
                                   f"{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.uri}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server not healthy:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Kill it (a throw-away server: no graceful shutdown to wait for)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def start_mlflow_server(home: Path) -> MlflowServer:
    """`mlflow server` on a free loopback port with a sqlite backend store under `home`, not
    waited for (`wait_healthy`); `stop` kills it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = home / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--backend-store-uri",
             f"sqlite:///{home / 'mlflow.db'}", "--artifacts-destination", str(home / "art"),
             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            stdout=out, stderr=subprocess.STDOUT, cwd=home, start_new_session=True)
    return MlflowServer(f"http://127.0.0.1:{port}", log, proc)


@pytest.fixture(scope="module", autouse=True)
def mlflow_starting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """The module's MLflow server, started when its first test starts and not waited for
    (its first start migrates a new database, ~20 s on 2 cores, while the tests that need no
    MLflow run)."""
    server = start_mlflow_server(tmp_path_factory.mktemp("mlflow"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def mlflow_server(mlflow_starting: MlflowServer) -> MlflowServer:
    """The module's MLflow server, once it answers."""
    mlflow_starting.wait_healthy()
    return mlflow_starting


# --- one shape for both trackers ----------------------------------------------------------
@dataclass
class TrackedRun:
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    points: list[tuple[int, float]] = field(default_factory=list)  # (seed, metric) per run
    numbers: dict[str, float] = field(default_factory=dict)  # the verdict or the summary
    diff: str | None = None
    logs: list[str] = field(default_factory=list)


@dataclass
class TrackedSweep:
    parent: TrackedRun
    children: dict[int, list[TrackedRun]]  # experiment id → its runs (one, if none is doubled)


def read_mlflow(uri: str, experiment: str, sweep: str, metric: str) -> TrackedSweep:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment}"
    runs = client.search_runs([exp.experiment_id],
                              filter_string=f"tags.`overnight.sweep` = '{sweep}'")
    parents = [r for r in runs if r.data.tags.get("overnight.role") == "sweep"]
    assert len(parents) == 1, f"{len(parents)} parent runs for {sweep}"
    parent = parents[0]
    out = TrackedSweep(TrackedRun(dict(parent.data.params), dict(parent.data.tags), [],
                                  dict(parent.data.metrics)), {})
    with tempfile.TemporaryDirectory() as tmp:
        for r in runs:
            if r.data.tags.get("mlflow.parentRunId") != parent.info.run_id:
                continue
            history = client.get_metric_history(r.info.run_id, metric)
            numbers = {k: v for k, v in r.data.metrics.items() if k != metric}
            where = client.download_artifacts(r.info.run_id, "change.diff", tmp)
            logs = [a.path for a in client.list_artifacts(r.info.run_id, "logs")]
            run = TrackedRun(dict(r.data.params), dict(r.data.tags),
                             sorted((m.step, m.value) for m in history), numbers,
                             Path(where).read_text(encoding="utf-8"), logs)
            out.children.setdefault(int(r.data.tags["overnight.experiment"]), []).append(run)
    return out


def wandb_records(path: Path) -> Iterator[Any]:
    """The protobuf records of one offline run file (`run-<id>.wandb`): wandb's own record
    format, a leveldb-style log of 32 KiB blocks after a 7-byte header."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    block, header, pos, pending = 32768, 7, 7, b""
    while pos + header <= len(data):
        left = block - pos % block
        if left < header:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + header])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + header:pos + header + length], pos + header + length
        if kind == 1:  # FULL
            raw = chunk
        elif kind == 2:  # FIRST
            pending = chunk
            continue
        elif kind == 3:  # MIDDLE
            pending += chunk
            continue
        else:  # LAST
            raw, pending = pending + chunk, b""
        record = pb.Record()
        record.ParseFromString(raw)
        yield record


def _key(item: Any) -> str:
    return item.key or ".".join(item.nested_key)


def read_wandb(wandb_dir: Path, sweep: str, metric: str) -> TrackedSweep:
    """Every offline run of `sweep` under `wandb_dir`/wandb, a run written in several
    sittings (a resumed id) merged in the order they were written."""
    runs: dict[str, dict[str, Any]] = {}
    for folder in sorted((wandb_dir / "wandb").glob("offline-run-*")):
        for path in folder.glob("run-*.wandb"):
            one = runs.setdefault(path.stem.removeprefix("run-"),
                                  {"config": {}, "summary": {}, "rows": [], "folders": []})
            one["folders"].append(folder)
            for rec in wandb_records(path):
                kind = rec.WhichOneof("record_type")
                if kind == "run":  # a resumed sitting keeps what the first one said
                    one.setdefault("group", rec.run.run_group)
                    one.setdefault("job", rec.run.job_type)
                    one.setdefault("tags", list(rec.run.tags))
                    for item in rec.run.config.update:
                        one["config"][_key(item)] = json.loads(item.value_json)
                elif kind == "config":
                    for item in rec.config.update:
                        one["config"][_key(item)] = json.loads(item.value_json)
                elif kind == "history":
                    one["rows"].append({_key(i): json.loads(i.value_json)
                                        for i in rec.history.item})
                elif kind == "summary":
                    for item in rec.summary.update:
                        one["summary"][_key(item)] = json.loads(item.value_json)
    mine = {i: r for i, r in runs.items() if r.get("group") == sweep}
    parents = [r for r in mine.values() if r["job"] == "sweep"]
    assert len(parents) == 1, f"{len(parents)} W&B sweep runs for {sweep}"
    p = parents[0]
    out = TrackedSweep(TrackedRun({}, {k: str(v) for k, v in p["config"].items()}, [],
                                  _numbers(p["summary"])), {})
    for r in mine.values():
        if r["job"] != "experiment":
            continue
        files = r["folders"][0] / "files"
        run = TrackedRun(
            {k: str(v) for k, v in r["config"].items() if not k.startswith(("overnight.", "_"))},
            {k: str(v) for k, v in r["config"].items() if k.startswith("overnight.")},
            sorted((row["seed"], row[metric]) for row in r["rows"] if metric in row),
            {k: v for k, v in _numbers(r["summary"]).items() if k not in (metric, "seed")},
            (files / "change.diff").read_text(encoding="utf-8"),
            sorted(p.name for p in (files / "logs").glob("*")) if (files / "logs").is_dir()
            else [])
        run.tags["labels"] = ",".join(r["tags"])
        out.children.setdefault(int(r["config"]["overnight.experiment"]), []).append(run)
    return out


def _numbers(summary: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in summary.items()
            if not k.startswith("_") and isinstance(v, int | float) and not isinstance(v, bool)}


# --- the check ----------------------------------------------------------------------------
def records(db: Path | str, sweep: str) -> dict[str, Any]:
    """The sweep as `overnight results --format json` prints it: the records any user reads."""
    proc = subprocess.run([str(BIN / "overnight"), "results", "--sweep", sweep, "--format",
                           "json", "--db", str(db)], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-8)  # results json rounds the delta


def compare(tracked: TrackedSweep, recs: dict[str, Any], stored: dict[int, Any]
            ) -> tuple[int, list[str]]:
    """How many numbers were compared, and every difference between the tracker and the
    records (`recs` as results json prints them, `stored` the store's experiments by id for
    what it leaves out: the diff, the parent commit): each finished experiment once, its runs'
    metrics by seed, its verdict (mean, 95 % interval, P(better), n, delta), its tags, params
    and diff; the sweep's numbers."""
    m, problems, n = recs["metric"], [], 0
    finished = [e for e in recs["experiments"] if e["status"] not in ("queued", "running")]
    if sorted(tracked.children) != sorted(e["id"] for e in finished):
        problems.append(f"experiments: tracker {sorted(tracked.children)} vs records "
                        f"{sorted(e['id'] for e in finished)}")
    for e in finished:
        got = tracked.children.get(e["id"], [])
        if len(got) != 1:
            problems.append(f"#{e['id']}: {len(got)} runs in the tracker")
            continue
        run, where = got[0], f"#{e['id']}"
        own = sorted((r["seed"], r["metric"]) for r in e["run_records"]
                     if r["role"] != "incumbent" and r["metric"] is not None)
        n += len(own)
        if run.points != own:
            problems.append(f"{where} runs: tracker {run.points} vs records {own}")
        want = {f"{m}_mean": e["metric"], f"{m}_ci95": e["ci95"], "p_better": e["p_better"],
                "runs": e["n"], f"{m}_delta": e["delta"]}
        for key, value in want.items():
            n += value is not None
            if not _same(run.numbers.get(key), value):
                problems.append(f"{where} {key}: tracker {run.numbers.get(key)} vs {value}")
        tags = {"status": e["status"], "commit": e["commit"], "proposer": e["proposer"],
                "crash_class": e["crash_kind"], "parent_commit": stored[e["id"]].base_commit}
        for key, value in tags.items():
            if run.tags.get(f"overnight.{key}") != value:
                problems.append(f"{where} tag {key}: {run.tags.get(f'overnight.{key}')!r} vs "
                                f"{value!r}")
        if not run.tags.get("overnight.link", "").endswith(f"/ui/experiments/{e['id']}"):
            problems.append(f"{where} link: {run.tags.get('overnight.link')!r}")
        if run.params.get("description") != e["description"]:
            problems.append(f"{where} description: {run.params.get('description')!r}")
        knob = e["meta"].get("knob")
        if knob and run.params.get(knob) != str(e["meta"]["new"]):
            problems.append(f"{where} knob {knob}: {run.params.get(knob)!r}")
        if run.diff != stored[e["id"]].diff:
            problems.append(f"{where}: the diff differs")
        if own and not run.logs:
            problems.append(f"{where}: no log")
    ev = recs["evidence"]
    sweep_numbers = {f"{m}_baseline": recs["baseline"], f"{m}_best": recs["best"],
                     "improvement": ev["improvement"], "sigma": ev["sigma"],
                     "kept": ev["kept"], "kept_supported": ev["kept_supported"]}
    for key, value in sweep_numbers.items():
        n += value is not None
        if not _same(tracked.parent.numbers.get(key), value):
            problems.append(f"sweep {key}: tracker {tracked.parent.numbers.get(key)} vs {value}")
    return n, problems


class Forward:
    """A loopback TCP port that forwards every connection to another (a tracker that comes
    back at the address it had); `close` stops it."""

    def __init__(self, port: int, to: int) -> None:
        import socketserver
        import threading

        target = ("127.0.0.1", to)

        class Pipe(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with socket.create_connection(target, timeout=30) as upstream:
                    def pump(a: socket.socket, b: socket.socket) -> None:
                        try:
                            while data := a.recv(65536):
                                b.sendall(data)
                        except OSError:
                            pass
                        finally:
                            try:
                                b.shutdown(socket.SHUT_WR)
                            except OSError:
                                pass

                    back = threading.Thread(target=pump, args=(upstream, self.request))
                    back.start()
                    pump(self.request, upstream)
                    back.join(30)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", port), Pipe)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
