"""`overnight adopt` on a third-party-style script, then a short real sweep over its argparse
defaults (data outside git as an asset, evaluation protected, its own progress format)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

from conftest import FIXTURES
from test_cli import OVERNIGHT, run

from agent.git.repo import init_repo
from db.engine import open_database
from db.reads import Reads
from db.store import SqlStore


def adopt(*args: str) -> subprocess.CompletedProcess[str]:
    # A bare environment (no virtualenv on PATH), but this checkout's code when PYTHONPATH
    # names it (a worktree beside an editable install of another).
    keep = {k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}
    return subprocess.run([OVERNIGHT, "adopt", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", **keep})


def wordlm(tmp_path: Path) -> Path:
    root = tmp_path / "word_language_model"
    shutil.copytree(FIXTURES / "wordlm_target", root)
    (root / ".gitignore").write_text("data/\n")
    (root / "data" / "wikitext-2").mkdir(parents=True)
    (root / "data" / "wikitext-2" / "train.txt").write_text("the cat sat on the mat " * 100)
    init_repo(root, "upstream")
    return root


def test_adopt_writes_the_target_and_a_short_sweep_tunes_argparse_defaults(tmp_path: Path):
    root = wordlm(tmp_path)
    proc = adopt(str(root), "--budget", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    target = tomllib.loads((root / "overnight.toml").read_text())["target"]
    assert target["command"] == "python main.py" and target["editable"] == ["main.py"]
    assert target["protected"] == ["evaluate.py", "overnight.toml"]
    assert target["assets"] == ["data"] and target["metric"] == "val_ppl"
    assert target["direction"] == "minimize" and "batches" in target["progress_regex"]
    assert "3 knob(s) will be searched" in proc.stdout  # emsize, lr, dropout (not seed, epochs)
    assert "still needs" not in proc.stdout  # it reads the budget and prints the block
    proc = run("run", "--target", str(root), "--db", str(tmp_path / "o.db"), check=False)
    assert proc.returncode == 2 and "overnight.toml" in proc.stderr  # not committed yet
    # Its metric is a pure function of its flags: identical repeats measure no noise, so each
    # change runs once and is kept when it is better.
    init_repo(root, "overnight target")
    db = tmp_path / "o.db"
    run("run", "--target", str(root), "--experiments", "6", "--budget", "1", "--sweep", "w1",
        "--db", str(db))
    data = json.loads(run("results", "--sweep", "w1", "--format", "json", "--db", str(db)).stdout)
    exps = data["experiments"]
    assert exps[0]["status"] == "kept" and len(exps) == 7
    changed = exps[1:]
    assert {e["status"] for e in changed} <= {"kept", "discarded"}
    assert any(e["status"] == "kept" for e in changed) and data["best"] < data["baseline"]
    store = SqlStore(open_database(db))
    sweep = store.get_sweep("w1")
    for exp in store.list_experiments(sweep.id)[1:]:
        minus = [ln for ln in exp.diff.splitlines() if ln.startswith("-") and ln[1:2] != "-"]
        assert len(minus) == 1 and "add_argument" in minus[0] and "default=" in minus[0]
    baseline = store.list_experiments(sweep.id)[0]
    points = Reads(store).loss_points(baseline.id)  # parsed with the progress_regex adopt wrote
    assert sorted((p.step, p.loss) for p in points) == [
        (1, 3.0), (1, 6.0), (2, 1.5), (2, 3.0), (3, 1.0), (3, 2.0)]


def test_adopt_without_a_metric_or_a_script_says_what_to_pass(tmp_path: Path):
    root = wordlm(tmp_path)
    text = (root / "main.py").read_text().replace("val_ppl", "perplexity_on_held_out")
    (root / "main.py").write_text(text)
    init_repo(root, "rename")
    proc = adopt(str(root))
    assert proc.returncode == 2 and "--metric" in proc.stderr
    assert not (root / "overnight.toml").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.py").write_text("x = 1\n")
    init_repo(empty)
    proc = adopt(str(empty))
    assert proc.returncode == 2 and "no training script found" in proc.stderr
