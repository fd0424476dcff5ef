"""The optional bwrap sandbox, probed from inside a real run (skipped where bwrap is missing).

A trainer tries what docs/threat-model.md lists; the same probes run without the sandbox
show what the sandbox adds. Real git, real SQLite, real subprocesses, real bwrap.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from conftest import make_target

from agent.core.config import load_config
from agent.core.domain import ExperimentStatus
from agent.engine.loop import Loop, LoopSettings
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo
from agent.ops.sweeps import create_sweep
from api.settings import ensure_token
from db.engine import open_database
from db.location import DbLocation
from db.store import SqlStore

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.timeout(120),
]

PROBES = '''
import os, socket
def probe(name, fn):
    try:
        fn()
        print(f"PROBE {name} allowed", flush=True)
    except Exception as exc:
        print(f"PROBE {name} denied {type(exc).__name__}", flush=True)
def read(path):
    return lambda: open(path, "rb").read(1) or (_ for _ in ()).throw(OSError("empty"))
def write(path):
    return lambda: open(path, "w").write("x")
def connect():
    socket.create_connection(("127.0.0.1", int(os.environ["PROBE_PORT"])), timeout=2).close()
probe("read_token", read(os.environ["PROBE_TOKEN"]))
probe("read_db", read(os.environ["PROBE_DB"]))
probe("list_other_worktree", lambda: os.listdir(os.environ["PROBE_OTHER"]) or 1 / 0)
probe("write_checkout", write(os.path.join(os.environ["PROBE_CHECKOUT"], "planted.py")))
probe("write_git_hooks", write(os.path.join(os.environ["PROBE_CHECKOUT"], ".git", "hooks", "x")))
probe("write_worktree", write("scratch.txt"))
probe("write_tmp", write("/tmp/scratch.txt"))
def write_cache():
    os.makedirs(os.environ["TORCHINDUCTOR_CACHE_DIR"], exist_ok=True)
    write(os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "graph.bin"))()
probe("write_compile_cache", write_cache)
probe("network", connect)
'''


def run_probes(tmp_path: Path, sandbox: str, network: bool = False) -> dict[str, str]:
    source = (Path(__file__).parent / "fixtures" / "fake_target" / "train.py").read_text()
    target = make_target(tmp_path / "t", edits={"train.py": PROBES + source})
    toml = target / "overnight.toml"
    toml.write_text(toml.read_text() + f'sandbox = "{sandbox}"\n'
                    f"sandbox_network = {'true' if network else 'false'}\n")
    db = tmp_path / "home" / "overnight.db"
    store = SqlStore(open_database(db))
    _, token_path, _ = ensure_token(db)
    work = DbLocation.parse(db).default_work_dir()
    other = work / "worktrees" / "other" / "exp-99"
    other.mkdir(parents=True)
    (other / "train.py").write_text("secret idea\n")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        env = {"PROBE_TOKEN": str(token_path), "PROBE_DB": str(db), "PROBE_OTHER": str(other),
               "PROBE_CHECKOUT": str(target), "PROBE_PORT": str(server.getsockname()[1]),
               "TORCHINDUCTOR_CACHE_DIR": str(work / "cache" / "sb" / "inductor")}
        sweep = create_sweep(store, GitRepo(target), target, name="sb", config=load_config(target))
        loop = Loop(store, GitRepo(target), SubprocessRunner(grace_s=0.5),
                    LoopSettings(work_dir=work, env=env))
        done = loop.execute(sweep, store.claim_next(sweep.id))
    assert done.status is ExperimentStatus.KEPT, (done.reason, done.log_tail)
    log = Path(done.log_path or "").read_text()
    assert (target / "planted.py").exists() is (sandbox == "none")
    assert (work / "cache" / "sb" / "inductor" / "graph.bin").exists()  # the cache persists
    return {line.split()[1]: line.split()[2] for line in log.splitlines()
            if line.startswith("PROBE ")}


def test_inside_the_sandbox_a_run_reaches_only_its_worktree_and_tmp(tmp_path: Path) -> None:
    seen = run_probes(tmp_path, "bwrap")
    assert seen == {
        "read_token": "denied", "read_db": "denied", "list_other_worktree": "denied",
        "write_checkout": "denied", "write_git_hooks": "denied", "network": "denied",
        "write_worktree": "allowed", "write_tmp": "allowed", "write_compile_cache": "allowed",
    }


def test_sandbox_network_can_be_allowed(tmp_path: Path) -> None:
    assert run_probes(tmp_path, "bwrap", network=True)["network"] == "allowed"


def test_without_the_sandbox_a_run_has_the_service_users_rights(tmp_path: Path) -> None:
    """What docs/threat-model.md says the sandbox is for."""
    seen = run_probes(tmp_path, "none")
    assert set(seen.values()) == {"allowed"}, seen


def test_an_interpreter_under_tmp_stays_visible(tmp_path):
    """A checkout (and its venv) under /tmp, as in a CI clone, survives the private /tmp."""
    from runner.sandbox import bwrap_command, interpreter_dirs

    exe_dir = Path("/tmp") / f"venv-{tmp_path.name}" / "bin"
    exe_dir.mkdir(parents=True)
    try:
        assert exe_dir in interpreter_dirs([str(exe_dir / "python"), "train.py"])
        assert Path("/usr/bin") not in interpreter_dirs(["/usr/bin/python3"])  # outside /tmp
        argv = bwrap_command([str(exe_dir / "python")], writable=tmp_path)
        tmpfs = argv.index("/tmp")  # --tmpfs /tmp comes first, the re-bind after it
        assert argv.index(str(exe_dir)) > tmpfs
    finally:
        exe_dir.rmdir()
        exe_dir.parent.rmdir()
