"""`overnight report`: the morning report's Markdown says what the records say.

A night through the real loop on the fake trainer with seed noise (kept and discarded changes, a
fundamental crash, a timeout, LLM spend); the report is made by the real CLI in a subprocess and
every number in it is checked against the records, worked out here without the report's code.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from report_fixtures import LLM, Night, expected, noisy_night

OVERNIGHT = Path(sys.executable).parent / "overnight"


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> Night:
    return noisy_night(tmp_path_factory.mktemp("report"))


def report(night: Night, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(OVERNIGHT), "report", "--sweep", night.name, "--db",
                           str(night.db), *args], capture_output=True, text=True, timeout=120,
                          check=False)


def section(md: str, heading: str) -> str:
    return md.split(f"## {heading}")[1].split("\n## ")[0]


def rows(text: str) -> list[list[str]]:
    out = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            out.append([c.strip() for c in line.strip("|").split(" | ")])
    return out[1:]  # without the header


def test_the_markdown_numbers_are_the_records(night: Night):
    proc = report(night)
    assert proc.returncode == 0, proc.stderr
    md, want = proc.stdout, expected(night)
    print(md)
    # The headline: baseline → best with the gain's interval, from the runs.
    head = re.search(r"\*\*val_bpb (\S+) → (\S+)\*\* \(lower is better; baseline n=(\d+), "
                     r"best n=(\d+)\): gain (\S+) ± (\S+) ", md)
    assert head, md[:600]
    assert float(head[1]) == pytest.approx(want["baseline"], abs=5e-7)
    assert float(head[2]) == pytest.approx(want["best"], abs=5e-7)
    assert (int(head[3]), int(head[4])) == (want["base_n"], want["best_n"])
    assert float(head[5]) == pytest.approx(want["gain"], abs=5e-7)
    assert float(head[6]) == pytest.approx(want["ci"], rel=5e-3)  # three digits
    counts = want["counts"]
    tried = sum(counts[s] for s in ("kept", "discarded", "crashed", "timeout")) - 1
    assert f"{counts['kept'] - 1} of {tried} changes kept (the baseline aside)" in md
    # Each kept change: the mean of its runs, n, Δ vs the runs it was compared with, diff stat.
    kept = rows(section(md, "Kept changes"))
    assert len(kept) == len(want["kept"]) >= 2
    for row, k in zip(kept, want["kept"], strict=True):
        assert int(row[0]) == k["id"] and f"(`{k['commit']}`)" in row[1]
        assert float(row[2].split(" (")[0]) == pytest.approx(k["mean"], abs=5e-7)
        assert int(row[3]) == k["n"]
        assert float(row[4].split(" ± ")[0]) == pytest.approx(k["delta"], abs=5e-7)
        assert row[6] == f"train.py +{k['added']} −{k['removed']}"
    # Crashes and timeouts by status, kind and cause.
    crashes = {(r[0], r[1], r[2]): int(r[3]) for r in rows(section(md, "Crashes and timeouts"))}
    assert crashes == {k: len(v) for k, v in want["crashes"].items()}
    assert ("crashed", "fundamental", "CUDA out of memory") in crashes
    assert ("timeout", "timeout", "timeout") in crashes
    # Cost: hours by status (the baseline and incumbent re-runs apart), and the LLM's; a night
    # on the CPU is costed in run hours, not GPU-hours
    assert "| for | runs | Run hours |" in md and "GPU-hours" not in md
    cost = {r[0]: (int(r[1]), float(r[2])) for r in rows(section(md, "Cost"))}
    total = cost.pop("total")
    assert set(cost) == set(want["hours"])
    for bucket, (n, hours) in cost.items():
        assert n == want["count"][bucket]
        assert hours == pytest.approx(want["hours"][bucket], rel=5e-4)  # 4 significant digits
    assert total[0] == want["runs"]
    assert total[1] == pytest.approx(sum(want["hours"].values()), rel=5e-4)
    tokens_in, tokens_out, usd = LLM
    assert f"{tokens_in:,} tokens in, {tokens_out:,} out, ${usd:.4f}" in md
    # What was learned and what to try next are there.
    assert "### Crash lessons" in md and "## What to try next" in md
    assert "`overnight finalize --sweep night --ablate`" in md


def test_html_is_one_self_contained_page(night: Night, tmp_path: Path):
    out = tmp_path / "r.html"
    proc = report(night, "--format", "html", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    html = out.read_text()
    assert html.startswith("<!doctype html>") and '<svg class="progress"' in html
    # Nothing outside the page: no stylesheet or script to fetch, no absolute URL at all.
    assert not re.search(r"<link|<script|<img|<iframe|@import|url\(", html)
    assert not re.search(r"(?:src|href)=\"(?!#)", html)
    assert "http://" not in html and "https://" not in html


def test_bad_input_is_refused_naming_it(night: Night, tmp_path: Path):
    proc = report(night, "--format", "pdf")
    assert proc.returncode == 2 and "--format must be md or html, got 'pdf'" in proc.stderr
    proc = subprocess.run([str(OVERNIGHT), "report", "--sweep", "nope", "--db", str(night.db)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "nope" in proc.stderr
    proc = report(night, "--output", str(tmp_path / "missing" / "r.md"))
    assert proc.returncode == 2 and "--output" in proc.stderr


def test_a_suspect_run_is_set_aside_and_said(night: Night, tmp_path: Path):
    """A run the engine marked suspect (its throughput measured the machine's load: it is off
    the usual machine condition) is in no value or n, and the report says how many were set
    aside; the rest still equal the records."""
    import sqlite3
    from dataclasses import replace

    from agent.core.domain import RunStatus
    from agent.rules.run_records import recorded_best
    from db.engine import open_database
    from db.store import SqlStore

    copy = tmp_path / "copy.db"
    with sqlite3.connect(night.db) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    store = SqlStore(open_database(copy))
    sweep = store.get_sweep(night.name)
    base = next(e for e in store.list_experiments(sweep.id) if e.is_baseline)
    base_runs = [r for r in store.list_runs(experiment_id=base.id) if r.status is RunStatus.OK]
    assert len(base_runs) >= 2
    # as the engine would see it: the run at ten times the speed of the commit's others,
    # marked suspect, and the baseline recorded again (agent.engine.incumbent.record_best)
    with sqlite3.connect(copy) as db:
        db.execute("UPDATE runs SET throughput = 100 WHERE \"commit\" = ?", (base.commit,))
        db.execute("UPDATE runs SET status = 'suspect', throughput = 1000 WHERE id = ?",
                   (base_runs[0].id,))
    value, _, _ = recorded_best(store.run_metrics(sweep.id), base.commit or "")
    with sqlite3.connect(copy) as db:
        db.execute("UPDATE sweeps SET baseline_metric = ? WHERE id = ?", (value, sweep.id))
        if sweep.best_commit == base.commit:
            db.execute("UPDATE sweeps SET best_metric = ? WHERE id = ?", (value, sweep.id))
    shadow = replace(night, db=copy, store=store)
    md = report(shadow).stdout
    want = expected(shadow)
    assert want["base_n"] == len(base_runs) - 1
    head = re.search(r"\*\*val_bpb (\S+) → \S+\*\* \(lower is better; baseline n=(\d+), ", md)
    assert head and int(head[2]) == want["base_n"]
    assert float(head[1]) == pytest.approx(want["baseline"], abs=5e-7)
    before = sum(r.status is RunStatus.SUSPECT for r in night.store.list_runs(sweep_id=sweep.id))
    runs = "1 run" if before == 0 else f"{before + 1} runs"  # the load may have marked some
    assert f"\n{runs} set aside (a run's speed said the machine's load had changed" in md
    assert ("set aside (a run's speed" in report(night).stdout) is (before > 0)
    out = tmp_path / "r.html"
    assert report(shadow, "--format", "html", "--output", str(out)).returncode == 0
    assert f'<p class="muted" id="set-aside">{runs} set aside (a run' in out.read_text()


@pytest.fixture(scope="module")
def remeasured(tmp_path_factory: pytest.TempPathFactory) -> Night:
    """A night whose kept changes are re-run as the incumbent (every other proposal)."""
    return noisy_night(tmp_path_factory.mktemp("remeasured"), incumbent_every=2)


def test_every_screen_reads_one_number_per_fact(remeasured: Night):
    """The same night on the console lines, the results table, results.tsv, the JSON, the
    morning report and finalize's commit messages: each kept change's value, n, P(better) and
    difference, and the baseline and the best, are one number each (its record: the mean of
    the runs it names, the difference from the incumbent runs it was compared with; the
    recorded best), and a kept commit measured again since its keep says so on every screen
    ("kept at …; now … on …")."""
    import json

    import git
    from rich.console import Console

    from agent.core.domain import ExperimentStatus, RunRole
    from agent.rules.run_records import recorded_best
    from overnight.console import LineLog

    night = remeasured
    store = night.store
    sweep = store.get_sweep(night.name)
    exps = store.list_experiments(sweep.id)
    runs = store.list_runs(sweep_id=sweep.id)
    kept = [e for e in exps if e.status is ExperimentStatus.KEPT]
    assert len(kept) >= 3  # the baseline and two changes
    out = Console(width=400, record=True)
    log = LineLog(out, sweep)
    for e in exps:
        log.on_event("finished", e, {})
    lines = {int(m[1]): m[0] for m in re.finditer(r"^#(\d+) .*$", out.export_text(), re.M)}
    tsv = cli(night, "results", "--format", "tsv").splitlines()[1:]
    by_commit = {row.split("\t")[0]: row.split("\t") for row in tsv}
    data = json.loads(cli(night, "results", "--format", "json"))
    table = cli(night, "results", "--format", "table")
    md = report(night).stdout
    kept_md = {int(r[0]): r for r in rows(section(md, "Kept changes"))}
    subprocess.run([str(OVERNIGHT), "finalize", "--sweep", night.name, "--db", str(night.db)],
                   check=True, capture_output=True, text=True, timeout=120)
    messages = git.Repo(night.target).git.log(
        "--format=%B%x00", f"overnight-final/{night.name}").split("\x00")
    by_exp = {int(m[1]): msg for msg in messages
              if (m := re.search(r"Overnight-Experiment: (\d+)", msg))}
    rows_json = {r["id"]: r for r in data["experiments"]}

    # the best and the baseline: the recorded ones, on every screen
    base_value, _, _ = recorded_best(runs, kept[0].commit or "")
    best_value, _, _ = recorded_best(runs, sweep.best_commit or "")
    assert (data["baseline"], data["best"]) == pytest.approx((base_value, best_value))
    assert data["evidence"]["improvement"] == pytest.approx(base_value - best_value)
    assert f"**val_bpb {base_value:.6f} → {best_value:.6f}**" in md
    assert f"baseline {base_value:.6f} (" in table and f"-> best {best_value:.6f} (on" in table
    remeasured = 0
    for e in kept[1:]:
        record = e.record
        assert record is not None and record.p_better is not None
        value, n, p_better = e.metric, record.n, record.p_better
        assert value is not None and e.delta is not None
        # what its runs measured, then its gain over the runs it was compared with, named
        said = f"{value:.6f} on 1 run" if n == 1 else f"mean {value:.6f} of {n} runs"
        gain = f"better than the incumbent's {record.incumbent.n if record.incumbent else 0} " \
            if record.incumbent and record.incumbent.n > 1 else "better than the incumbent's run"
        assert f"val_bpb {said}: {gain}" in lines[e.id]  # the console line
        assert f"by {abs(e.delta):.6f} ± {record.se:.3g}" in lines[e.id]
        assert float(by_commit[(e.commit or "")[:7]][1]) == pytest.approx(value, abs=5e-7)
        mine = rows_json[e.id]
        assert (mine["metric"], mine["n"], mine["p_better"]) == (value, n, p_better)
        row = kept_md[e.id]
        assert float(row[2].split()[0]) == pytest.approx(value, abs=5e-7) and int(row[3]) == n
        assert float(row[4].split(" ± ")[0]) == pytest.approx(e.delta, abs=5e-7)
        assert row[5].startswith(f"{p_better:.2f}")
        message = by_exp[e.id]
        assert f"Evidence: val_bpb {said}: {gain}" in message
        assert f"P(better) {p_better:.2f}" in message
        reruns = sum(r.role is RunRole.INCUMBENT and r.commit == e.commit for r in runs)
        assert mine["reruns"] == reruns
        if reruns:  # measured again since the keep: every screen says so, in the same words
            remeasured += 1
            now, _, off = recorded_best(runs, e.commit or "")
            words = (f"kept at {value:.6f} on {n} run{'s' if n != 1 else ''}; now {now:.6f} "
                     f"on {sum(not o for o in off)}")
            assert mine["commit_mean"] == pytest.approx(now)
            assert words in table and words in row[2] and words in message, (words, row)
    assert remeasured, "the night re-ran no kept change: nothing re-measured was compared"


def cli(night: Night, *args: str) -> str:
    import os

    proc = subprocess.run([str(OVERNIGHT), *args, "--sweep", night.name, "--db", str(night.db)],
                          capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, "COLUMNS": "500"})  # a table row on one line
    return proc.stdout


def test_the_cost_is_in_gpu_hours_only_when_every_run_held_a_gpu():
    from agent.analysis.morning import Cost

    def unit(devices: tuple[str, ...]) -> str:
        return Cost([], 0.0, 0, devices, 0, 0, 0.0).unit

    assert unit(("cuda:0", "cuda:1")) == "GPU-hours"
    assert unit(("cpu",)) == unit(()) == unit(("cuda:0", "cpu")) == "Run hours"
