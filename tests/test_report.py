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
    assert float(head[6]) == pytest.approx(want["ci"], abs=5e-7)
    counts = want["counts"]
    assert f"{sum(counts.values())} experiments: {counts['kept']} kept" in md
    # Each kept change: mean, n, Δ vs the best before, diff stat, commit.
    kept = rows(section(md, "Kept changes"))
    assert len(kept) == len(want["kept"]) >= 2
    for row, k in zip(kept, want["kept"], strict=True):
        assert int(row[0]) == k["id"] and f"(`{k['commit']}`)" in row[1]
        assert float(row[2].split(" ± ")[0]) == pytest.approx(k["mean"], abs=5e-7)
        assert int(row[3]) == k["n"]
        assert float(row[4]) == pytest.approx(k["delta"], abs=5e-7)
        assert row[6] == f"train.py +{k['added']} −{k['removed']}"
    # Crashes and timeouts by status, kind and cause.
    crashes = {(r[0], r[1], r[2]): int(r[3]) for r in rows(section(md, "Crashes and timeouts"))}
    assert crashes == {k: len(v) for k, v in want["crashes"].items()}
    assert ("crashed", "fundamental", "CUDA out of memory") in crashes
    assert ("timeout", "timeout", "timeout") in crashes
    # Cost: GPU-hours by status (the baseline and incumbent re-runs apart), and the LLM's.
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
    """A run the engine marked suspect (its throughput measured the machine's load) is in no
    mean or n, and the report says how many were set aside; the rest still equal the records."""
    import sqlite3
    from dataclasses import replace

    from agent.core.domain import RunStatus
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
    store.set_run_status(base_runs[0].id, RunStatus.SUSPECT)
    shadow = replace(night, db=copy, store=store)
    md = report(shadow).stdout
    want = expected(shadow)
    assert want["base_n"] == len(base_runs) - 1
    head = re.search(r"\*\*val_bpb (\S+) → \S+\*\* \(lower is better; baseline n=(\d+), ", md)
    assert head and int(head[2]) == want["base_n"]
    assert float(head[1]) == pytest.approx(want["baseline"], abs=5e-7)
    before = sum(r.status is RunStatus.SUSPECT for r in night.store.list_runs(sweep_id=sweep.id))
    runs = "1 run" if before == 0 else f"{before + 1} runs"  # the load may have marked some
    assert f"\n{runs} set aside as suspect (a throughput that says the machine's load" in md
    assert ("set aside as suspect" in report(night).stdout) is (before > 0)
    out = tmp_path / "r.html"
    assert report(shadow, "--format", "html", "--output", str(out)).returncode == 0
    assert f'<p class="muted" id="set-aside">{runs} set aside as suspect' in out.read_text()
