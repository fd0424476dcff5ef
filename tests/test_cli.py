"""The `overnight` command as a user runs it: real subprocesses, real git, a real SQLite file."""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import git
import pytest
from gpt_checks import check_learning

OVERNIGHT = str(Path(sys.executable).parent / "overnight")


def run(*args: str, env: dict[str, str] | None = None, check: bool = True, timeout: int = 300):
    proc = subprocess.run(
        [OVERNIGHT, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_run_results_and_status(tmp_path: Path, target: Path):
    db = str(tmp_path / "o.db")
    out = run(
        "run", "--target", str(target), "--experiments", "5", "--db", db, "--sweep", "night1"
    ).stdout
    assert "sweep night1" in out and "baseline" in out
    # the end-of-night summary starts from the digest of what was learned
    summary = out.split("# Sweep night1: what has been learned")[1]
    assert "val_bpb (lower is better): baseline 1.3" in summary
    assert "## Knobs tried" in summary and summary.index("## Knobs tried") < summary.index(
        "val_bpb baseline 1.300000 (on 5 runs) -> best")
    # the fake trainer reports 0.0 s of training for a 1 s budget: a contract warning
    assert "warning #1, #2, #3, #4, #5 … (6): trained only 0 s of a 1 s budget" in out
    # the noise-free fake trainer ignores its seed: σ̂ is not measured (no interval claims a
    # width its identical repeats cannot show), and every gain is kept on one run, saying so
    assert re.search(r"\nσ̂ not measured; improvement baseline → best \+0\.\d+ val_bpb\n", out), out
    assert "│ 1.300000           │ 5    │" in out  # the baseline: the mean of its 5 runs
    statement = re.fullmatch(r"(\d+) change\(s\) kept on one run each: the noise was not "
                             r"measured \(identical repeats\), so no keep is a tested claim",
                             out.strip().splitlines()[-1])
    assert statement, out.strip().splitlines()[-1]
    tsv = run("results", "--sweep", "night1", "--format", "tsv", "--db", db).stdout
    lines = tsv.splitlines()
    assert lines[0].split("\t") == ["commit", "val_bpb", "memory_gb", "status", "description"]
    assert len(lines) == 7
    rows = [line.split("\t") for line in lines[1:]]
    assert rows[0][1:4] == ["1.300000", "2.0", "keep"] and rows[0][4] == "baseline"
    assert all(len(r[0]) == 7 for r in rows)
    assert {r[3] for r in rows} <= {"keep", "discard", "crash"}
    data = json.loads(
        run("results", "--target", str(target), "--format", "json", "--db", db).stdout
    )
    assert data["sweep"] == "night1" and len(data["experiments"]) == 6
    assert data["best"] < data["baseline"]
    assert data["evidence"]["kept_supported"] == 0 and data["evidence"]["kept"] >= 1
    assert data["evidence"]["kept"] == int(statement.group(1))
    base = data["experiments"][0]
    assert base["n"] == 5 and base["runs"] == [1.3] * 5 and base["sd"] == 0.0
    assert base["warnings"] and all(e["n"] >= 1 for e in data["experiments"])
    full = run("results", "--sweep", "night1", "--format", "tsv-full", "--db", db).stdout
    header, first = full.splitlines()[0].split("\t"), full.splitlines()[1].split("\t")
    assert header[5:] == ["n", "sd", "p_better", "runs", "difference", "se"]
    assert header[:5] == lines[0].split("\t")
    assert first[5] == "5" and first[8] == ",".join(["1.300000"] * 5)
    status = run("status", "--db", db).stdout
    assert "night1" in status and "keeps" in status
    # the default sweep name is a date tag, made unique
    env = {"OVERNIGHT_DB": db}
    run("run", "--target", str(target), "--experiments", "1", env=env)
    run("run", "--target", str(target), "--experiments", "1", env=env)
    names = [
        s for s in run("status", env=env).stdout.split() if s[:3].isalpha() and s[3:5].isdigit()
    ]
    assert len(set(names)) >= 2


def test_user_errors_are_one_line(tmp_path: Path, target: Path):
    db = str(tmp_path / "o.db")
    proc = run("run", "--target", str(tmp_path / "missing"), "--db", db, check=False)
    assert proc.returncode == 2 and "overnight.toml" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run("run", "--target", str(target), "--sweep", "bad name!", "--db", db, check=False)
    assert proc.returncode == 2 and "sweep name" in proc.stderr
    run("run", "--target", str(target), "--sweep", "dup", "--experiments", "0", "--db", db)
    proc = run("run", "--target", str(target), "--sweep", "dup", "--db", db, check=False)
    assert proc.returncode == 2 and "already exists" in proc.stderr
    proc = run("results", "--sweep", "nope", "--db", db, check=False)
    assert proc.returncode == 2 and "nope" in proc.stderr
    proc = run("init", str(tmp_path / "t"), "--template", "nope", check=False)
    assert proc.returncode == 2 and "gpt" in proc.stderr


def test_run_takes_a_compute_budget(tmp_path: Path, target: Path):
    """`--budget "5 steps"` in place of seconds: the sweep's budget, said as such, and each run
    checked against its steps (the fake trainer trains 3 whatever it is told), not its seconds."""
    db = str(tmp_path / "o.db")
    out = run("run", "--target", str(target), "--experiments", "1", "--db", db, "--sweep",
              "steps", "--budget", "5 steps").stdout
    assert "budget 5 steps" in out and "trained only" not in out
    assert "trained 3 steps of a 5 steps budget" in out
    from agent.core.budget import ComputeBudget
    from db.engine import open_database
    from db.store import SqlStore

    engine = open_database(db)
    try:
        config = SqlStore(engine).get_sweep("steps").config
    finally:
        engine.dispose()
    assert config.budget == ComputeBudget(5, "steps") and config.timeout_s == 20
    bad = run("run", "--target", str(target), "--budget", "600 laps", "--db", db, check=False)
    assert bad.returncode == 2 and "--budget: must be" in bad.stderr


def test_init_makes_a_committed_gpt_target(tmp_path: Path):
    dest = tmp_path / "night"
    run("init", str(dest), "--template", "gpt")
    repo = git.Repo(dest)
    assert not repo.is_dirty(untracked_files=True)
    files = set(repo.git.ls_files().split())
    assert {"train.py", "prepare.py", "overnight.toml", "program.md"} <= files
    proc = run("init", str(dest), check=False)
    assert proc.returncode == 2 and "not empty" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(1500)  # a hang bound: baseline x3 and repeated runs on a busy machine
def test_demo_on_the_real_gpt_target(tmp_path: Path):
    """The README's main job, shortened: a real CPU sweep of the gpt target."""
    db = tmp_path / "demo.db"
    out = run(
        "demo",
        "--budget",
        "3",
        "--experiments",
        "2",
        "--db",
        str(db),
        "--dir",
        str(tmp_path / "demo-target"),
        timeout=1150,
    ).stdout
    assert "results.tsv" in out and "git log overnight/demo-" in out
    tsv = out.split("results.tsv", 1)[1].split("git log", 1)[0]
    rows = [line.split("\t") for line in tsv.strip().splitlines()[1:]]
    assert rows[0][3] == "keep" and rows[0][4] == "baseline"
    # The baseline's metric is the mean of its good runs (the sequential rule runs it up to 3
    # times; a run whose throughput is off the others' measured the machine, not the change, and
    # is marked suspect: left out, as on a busy machine). Each run is judged against its own
    # initial loss, its log's val_bpb is its record's metric, and the mean is of the good ones.
    from agent.core.domain import RunRole, RunStatus
    from db.engine import open_database
    from db.store import SqlStore

    engine = open_database(db)
    try:
        store = SqlStore(engine)
        base = store.list_experiments()[0]
        runs = [r for r in store.list_runs(experiment_id=base.id)
                if r.role is not RunRole.INCUMBENT]  # the best's re-runs count for the best
    finally:
        engine.dispose()
    assert base.is_baseline and runs and Path(runs[0].log_path or "").name == "1.log", runs
    good = []
    for r in runs:
        text = Path(r.log_path or "").read_text()
        (bpb,) = re.findall(r"^val_bpb:\s+(\S+)$", text, re.M)
        check_learning(text, float(bpb))
        assert r.metric == pytest.approx(float(bpb), abs=1e-6), r
        if r.status is RunStatus.OK:
            good.append(float(bpb))
        else:
            assert r.status is RunStatus.SUSPECT, r
    assert good and float(rows[0][1]) == pytest.approx(statistics.fmean(good), abs=1e-5)
    assert len(rows) == 3
    assert all(r[3] in ("keep", "discard", "crash", "stopped") and len(r[0]) == 7 for r in rows)
    # a change the early stop ended (at 3 s a lower learning rate is often far behind at its first
    # check) has no value of its own (only the mean of earlier full runs, when it had some), and
    # its description says where it was stopped
    for r in rows:
        if r[3] == "stopped":
            assert re.search(r"\[stopped early at \d+ % of the budget", r[4]), r
            assert r[1] == "" or float(r[1]) > 0, r
    # it ends with one plain sentence: the change kept, or why none was and what to do (no
    # σ̂, no incumbent: agent.ops.demo.closing_sentence)
    last = out.strip().splitlines()[-1]
    assert last.startswith(("Kept ", "Nothing was kept: ")) and last.endswith("."), last
    assert "σ" not in last and "incumbent" not in last
    # before the first run it said how busy the machine is and what that will cost
    assert out.startswith("This machine: load average ") and "Expect about " in out
    # the dashboard line names the command that prints the token its login form asks for
    hint = next(line for line in out.splitlines() if line.startswith("see it in the dashboard"))
    assert f"serve --db {db}" in hint
    (command,) = re.findall(r"sign in with the token that (.+) prints$", hint)
    printed = subprocess.run(shlex.split(command), capture_output=True, text=True, check=True,
                             env={k: v for k, v in os.environ.items() if k != "OVERNIGHT_TOKEN"})
    assert printed.stdout.strip() == Path(f"{db}.token").read_text().strip()
    # what the night wrote is its user's only: its throw-away target's history included (the
    # template's files keep their modes)
    git_dir = tmp_path / "demo-target" / ".git"
    for made in (git_dir, *git_dir.rglob("*")):
        assert made.stat().st_mode & 0o077 == 0, made


def test_token_prints_what_serve_uses(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "OVERNIGHT_TOKEN"}
    db = tmp_path / "home" / "o.db"
    first = subprocess.run([OVERNIGHT, "token", "--db", str(db)], capture_output=True,
                           text=True, env=env, check=True)
    token = first.stdout.strip()
    path = Path(f"{db}.token")
    assert len(token) >= 32 and first.stdout == token + "\n"  # the token alone on stdout
    assert f"created {path} (mode 0600)" in first.stderr
    assert path.read_text().strip() == token and path.stat().st_mode & 0o777 == 0o600
    again = subprocess.run([OVERNIGHT, "token", "--db", str(db)], capture_output=True,
                           text=True, env=env, check=True)
    assert again.stdout.strip() == token and "created" not in again.stderr
    given = run("token", "--db", str(db), env={"OVERNIGHT_TOKEN": "from-the-env-0123456789"})
    assert given.stdout.strip() == "from-the-env-0123456789" and "$OVERNIGHT_TOKEN" in given.stderr
    bad = run("token", "--db", "mysql://x/y", check=False)
    assert bad.returncode == 2 and "--db" in bad.stderr and bad.stdout == ""


def test_kill_9_then_resume_loses_nothing_and_repeats_nothing(tmp_path: Path):
    """A foreground run killed mid-experiment continues with --resume."""
    import signal
    import time

    from conftest import make_target

    from db.engine import open_database
    from db.store import SqlStore

    fixture = Path(__file__).parent / "fixtures" / "fake_target"
    text = (fixture / "train.py").read_text().replace("SLEEP_S = 0.0", "SLEEP_S = 1.5")
    target = make_target(tmp_path / "t", edits={"train.py": text})
    db = tmp_path / "o.db"
    args = [OVERNIGHT, "run", "--target", str(target), "--experiments", "3", "--sweep", "k9",
            "--db", str(db)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = SqlStore(open_database(db))
    exps: list = []
    while proc.poll() is None:  # kill while the second experiment is running (a busy machine
        # only makes the baseline's five runs slower: wait on the state, not on a clock)
        exps = store.list_experiments(store.get_sweep("k9").id) if store.list_sweeps() else []
        if len(exps) >= 2 and exps[1].status.value == "running" and exps[1].pgid:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before its second experiment ran"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed = exps[1]
    out = run("run", "--target", str(target), "--sweep", "k9", "--resume", "--db", str(db))
    assert "recovered 1 interrupted" in out.stdout
    exps = store.list_experiments(store.get_sweep("k9").id)
    statuses = [e.status.value for e in exps]
    assert statuses.count("interrupted") == 1
    assert store.get_experiment(killed.id).status.value == "interrupted"
    retry = [e for e in exps if e.meta.get("retry_of") == killed.id]
    assert len(retry) == 1 and retry[0].diff == killed.diff
    assert retry[0].status.value in ("kept", "discarded")
    assert store.get_sweep("k9").status.value == "done"
    # each finished experiment ran once: one log per started row, no duplicate diffs kept/run
    ran = [e for e in exps if e.status.value in ("kept", "discarded")]
    assert len({e.diff for e in ran}) == len(ran) == 4  # baseline + 3
    branch_tip = git.Repo(target).git.rev_parse("overnight/k9")
    assert branch_tip == store.get_sweep("k9").best_commit


def test_run_refuses_while_another_process_holds_the_database(tmp_path: Path, target: Path):
    from agent.engine.recovery import InstanceLock

    db = tmp_path / "o.db"
    lock = InstanceLock(db).acquire()
    try:
        proc = run("run", "--target", str(target), "--db", str(db), check=False)
    finally:
        lock.release()
    assert proc.returncode == 2 and "already using this database" in proc.stderr


def test_status_shows_the_latest_sweeps_and_all_with_all(tmp_path: Path):
    """A year of nights: `status` lists the latest 30 sweeps (newest last) and says how many
    older ones it left out; `--all` lists every one. Counts are the sweeps' own."""
    from test_store_contract import spec

    from agent.core.domain import ExperimentStatus as S
    from agent.core.domain import Finish, Proposal
    from db.engine import open_database
    from db.store import SqlStore
    from overnight.cli_results import STATUS_LATEST

    db = tmp_path / "year.db"
    engine = open_database(db)
    store = SqlStore(engine)
    for night in range(STATUS_LATEST + 3):
        sid = store.create_sweep(spec(f"night{night:02d}")).id
        for k in range(night % 4):  # night n has n % 4 kept experiments
            e = store.add_experiment(sid, Proposal(f"change {k}", f"d{k}"))
            store.claim(e.id)
            store.finish(e.id, Finish(S.KEPT, metric=1.0 - k / 10))
    engine.dispose()

    def rows(out: str) -> dict[str, list[str]]:
        cells = ([c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines())
        return {c[0]: c for c in cells if c and c[0].startswith("night")}

    latest = run("status", "--db", str(db)).stdout
    shown = rows(latest)
    assert list(shown) == [f"night{n:02d}" for n in range(3, STATUS_LATEST + 3)]
    assert "3 older sweep(s) not shown (--all shows them)" in latest
    assert [shown[f"night{n:02d}"][3] for n in range(4, 8)] == ["0", "1", "2", "3"]
    every = run("status", "--all", "--db", str(db)).stdout
    assert list(rows(every)) == [f"night{n:02d}" for n in range(STATUS_LATEST + 3)]
    assert "not shown" not in every


def test_resuming_a_done_sweep_takes_its_branch_back(tmp_path: Path, target: Path):
    """A done night's branch is its owner's (restart recovery leaves it); `--resume` makes the
    sweep the service's again, so its branch goes back to the recorded best, and says so."""
    from agent.git.repo import GitRepo
    from db.engine import open_database
    from db.store import SqlStore

    db = str(tmp_path / "o.db")
    run("run", "--target", str(target), "--experiments", "1", "--sweep", "n1", "--db", db)
    engine = open_database(db)
    sweep = SqlStore(engine).get_sweep("n1")
    engine.dispose()
    assert sweep.status.value == "done" and sweep.best_commit
    repo, raw = GitRepo(target), git.Repo(target).git
    mine = raw.commit_tree(f"{sweep.best_commit}^{{tree}}", "-p", sweep.best_commit,
                           "-m", "my own commit on the night's branch")
    repo.set_ref(f"refs/heads/{sweep.branch}", mine)
    status = run("status", "--db", db).stdout  # opens the database: no recovery here
    assert "n1" in status and repo.head(sweep.branch) == mine
    out = run("run", "--target", str(target), "--sweep", "n1", "--resume", "--db", db).stdout
    assert f"was at {mine[:7]}: reset to the sweep's best {sweep.best_commit[:7]}" in out
    assert repo.head(sweep.branch) == sweep.best_commit


def test_a_cuda_device_where_no_gpu_shows_is_not_started(tmp_path: Path, target: Path):
    """`run --device cuda` on a machine without a GPU (on a GPU host, CUDA_VISIBLE_DEVICES=-1
    hides them): the local executor does not start the run. The command says so in one
    sentence with the fix and exits 2; the baseline is recorded not started (not crashed) and
    queued again, the sweep paused, and nothing blames the script. With --device cpu the
    resumed sweep runs."""
    import glob

    from agent.core.domain import ExperimentStatus, RunStatus, SweepStatus
    from agent.core.record import Ending
    from agent.executors.local import GPU_FILES
    from db.reads import Reads
    from overnight.cli_setup import baseline_checks
    from overnight.runtime import Runtime

    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if any(glob.glob(pattern) for pattern in GPU_FILES):
        env["CUDA_VISIBLE_DEVICES"] = "-1"
        where = "CUDA_VISIBLE_DEVICES='-1' hides every GPU"
    else:
        where = "this machine has no GPU (no NVIDIA or AMD device under /dev)"
    sentence = (f"the run asks for device 'cuda' and {where}: run it on the CPU (--device cpu), "
                "or on a machine with a GPU")
    db = tmp_path / "o.db"
    argv = [OVERNIGHT, "run", "--target", str(target), "--sweep", "gpu", "--experiments", "1",
            "--db", str(db)]
    proc = subprocess.run([*argv, "--device", "cuda"], capture_output=True, text=True,
                          timeout=300, env={**env, "COLUMNS": "200"}, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"error: {sentence}", proc.stderr
    for blame in ("summary block", "budget honoured", "✗", "crash", "Traceback"):
        assert blame not in proc.stdout + proc.stderr, (blame, proc.stdout, proc.stderr)
    runtime = Runtime(db)
    try:
        sweep = runtime.store.get_sweep("gpu")
        assert sweep.status is SweepStatus.PAUSED
        base, retry = runtime.store.list_experiments(sweep.id)
        assert base.record is not None and base.record.ending is Ending.NOT_STARTED
        assert base.status is ExperimentStatus.CANCELLED and base.reason == sentence
        assert base.crash_kind is None and not base.meta.get("warnings")
        assert [r.status for r in runtime.store.list_runs(experiment_id=base.id)] == [
            RunStatus.CANCELLED]
        assert retry.retry_of == base.id and retry.status is ExperimentStatus.QUEUED
        assert baseline_checks(Reads(runtime.store), sweep) == []
    finally:
        runtime.close()
    resumed = subprocess.run([*argv, "--resume", "--device", "cpu"], capture_output=True,
                             text=True, timeout=300, env={**env, "COLUMNS": "200"}, check=False)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    runtime = Runtime(db)
    try:
        exps = runtime.store.list_experiments(runtime.store.get_sweep("gpu").id)
        assert exps[1].retry_of == exps[0].id and exps[1].status is ExperimentStatus.KEPT
    finally:
        runtime.close()
