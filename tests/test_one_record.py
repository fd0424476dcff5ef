"""One record, every screen: a night on a machine whose speed changes under it, as it does beside
`../shared/tools/hog.sh` (tests/load_world.py: busy and quiet by turns; three real gains among
null changes; the best re-run every third proposal, so the baseline and the keep are measured
again), read through the console, `overnight status`, results TSV and JSON, the morning report
and the dashboard. Each fact reads the same on every screen, each value is the mean of runs that
measured it, and each comparison names the runs it was against.

These are the disagreements found on a newcomer's demo night (issue "One record"), one test per
kind: a value no run measured; a best that reads differently per screen; counts defined four
ways; σ̂ without saying which; deltas against a moving "best then". To read a recorded night
instead (`overnight demo`'s beside hog.sh, say): OVERNIGHT_RECORD_DB=path/to/o.db
OVERNIGHT_RECORD_SWEEP=demo-… pytest this file.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pytest
from browser_helpers import make_app
from fastapi.testclient import TestClient
from load_world import load_night
from test_cli import run

from agent.core.domain import Experiment, ExperimentStatus, Run, RunRole, RunStatus
from agent.core.record import Ending
from db.store import SqlStore

S = ExperimentStatus
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Night:
    store: SqlStore
    sweep_id: int
    db: Path
    recorded: bool = False  # a night recorded elsewhere (OVERNIGHT_RECORD_DB), not the fixture's

    @property
    def name(self) -> str:
        return str(self.sweep.name)

    @property
    def metric(self) -> str:
        return str(self.sweep.metric)

    @cached_property
    def exps(self) -> list[Experiment]:
        return self.store.list_experiments(self.sweep_id)

    @cached_property
    def runs(self) -> dict[int, Run]:
        return {r.id: r for r in self.store.list_runs(sweep_id=self.sweep_id)}

    @cached_property
    def sweep(self):  # type: ignore[no-untyped-def]
        return self.store.get_sweep_by_id(self.sweep_id)

    def cli(self, *args: str) -> str:
        return run(*args, "--db", str(self.db), env={"COLUMNS": "260"}).stdout

    @cached_property
    def json(self) -> dict:  # type: ignore[type-arg]
        return json.loads(self.cli("results", "--sweep", self.name, "--format", "json"))

    @cached_property
    def tsv(self) -> dict[str, dict[str, str]]:
        lines = self.cli("results", "--sweep", self.name, "--format", "tsv-full").splitlines()
        head = lines[0].split("\t")
        return {row[0]: dict(zip(head, row, strict=True))
                for row in (line.split("\t") for line in lines[1:])}

    @cached_property
    def table(self) -> tuple[dict[str, list[str]], str]:
        out = self.cli("results", "--sweep", self.name, "--format", "table")
        return rows_of(out), out

    @cached_property
    def pages(self) -> dict[str, str]:
        with TestClient(make_app(self.db)) as c:
            got = {"sweep": c.get(f"/ui/sweeps/{self.name}").text,
                   "report": c.get(f"/ui/sweeps/{self.name}/report").text}
            for e in self.exps:
                got[f"exp{e.id}"] = c.get(f"/ui/experiments/{e.id}").text
        return got


def rows_of(table: str) -> dict[str, list[str]]:
    """A rich table's rows by their first cell (its lines at COLUMNS=260 do not wrap)."""
    return {cells[0]: cells for line in table.splitlines() if line.startswith("│")
            for cells in [[c.strip() for c in line.strip("│").split("│")]]}


def text_of(html: str, element_id: str) -> str:
    found = re.search(rf'<(\w+)[^>]*\bid="{element_id}"[^>]*>(.*?)</\1>', html, re.S)
    assert found is not None, element_id
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", found.group(2))).strip()


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> Night:
    if os.environ.get("OVERNIGHT_RECORD_DB"):
        from db.engine import open_database

        db = Path(os.environ["OVERNIGHT_RECORD_DB"])
        store = SqlStore(open_database(db))
        sweep = store.get_sweep(os.environ["OVERNIGHT_RECORD_SWEEP"])
        return Night(store, sweep.id, db, recorded=True)
    store, sweep_id, db = load_night(tmp_path_factory.mktemp("record"), proposals=14,
                                     gains={3: 0.08, 6: 0.012, 9: 0.05}, incumbent_every=3)
    return Night(store, sweep_id, db)


def test_the_night_has_what_the_screens_disagreed_on(night: Night) -> None:
    """The shapes behind the demo's disagreements are all here: a keep, a re-measured
    baseline and keep, runs set aside, runs compared in other machine conditions."""
    if night.recorded:
        pytest.skip("a recorded night has what it has")
    kept = [e for e in night.exps if e.status is S.KEPT and not e.is_baseline]
    reruns = [r for r in night.runs.values() if r.role is RunRole.INCUMBENT]
    assert kept and reruns and {r.experiment_id for r in reruns} >= {night.exps[0].id}
    assert any(r.status is RunStatus.SUSPECT for r in night.runs.values())
    assert any(e.record and len(e.record.conditions) > 1 for e in night.exps)


def test_every_value_is_the_mean_of_the_runs_its_record_names(night: Night) -> None:
    """Not the best less a gain: each number shown as an experiment's value is the mean of
    its own runs, each of which printed that metric."""
    for e in night.exps:
        record = e.record
        assert record is not None, e.id
        if not record.change.n:
            assert e.metric is None or record.ending in (Ending.CRASHED, Ending.TIMEOUT)
            continue
        named = [night.runs[i] for i in record.change.runs]
        assert all(r.experiment_id == e.id and r.role is not RunRole.INCUMBENT for r in named)
        assert [r.metric for r in named] == list(record.change.values)
        assert e.metric == pytest.approx(statistics.fmean(record.change.values), abs=1e-9)
        # the incumbent runs it was compared with are runs of the commit it was built on
        if record.incumbent is not None:
            assert {night.runs[i].commit for i in record.incumbent.runs} == {e.base_commit}


def test_each_value_its_runs_and_its_difference_read_the_same_on_every_screen(night: Night):
    rows, _ = night.table
    by_id = {row["id"]: row for row in night.json["experiments"]}
    sweep_page = night.pages["sweep"]
    for e in night.exps:
        record = e.record
        assert record is not None
        value = "" if e.metric is None else f"{e.metric:.6f}"
        aside = len(record.set_aside)
        j = by_id[e.id]
        assert (j["metric"], j["n"], j["mean"], j["runs"]) == (
            e.metric, record.n, record.change.mean, list(record.change.values)), e.id
        assert len(j["set_aside"]) == aside and j["delta"] == record.difference  # exactly
        console = rows[str(e.id)]
        assert console[3] == (value or "-")
        assert console[4].split()[0] == str(record.n) if record.n or aside else True
        assert (f"+{aside} set aside" in console[4]) == bool(aside)
        d = record.difference
        difference = "" if d is None else "0.000000" if round(d, 6) == 0 else f"{d:+.6f}"
        assert console[5].startswith(difference)
        if e.commit and e.status in (S.KEPT, S.DISCARDED):
            t = night.tsv[e.commit[:7]]
            assert (t[night.metric], t["n"], t["difference"]) == (value, str(record.n),
                                                                   difference)
        cells = re.search(rf'href="/ui/experiments/{e.id}">{e.id}</a></td>(.*?)</tr>',
                          sweep_page, re.S)
        assert cells is not None
        shown = [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", c)).strip()
                 for c in re.findall(r"<td[^>]*>(.*?)</td>", cells.group(1), re.S)]
        assert shown[1].startswith(value or "–") and shown[2] == console[4]
        assert shown[3] == console[5]


def test_the_best_reads_the_same_on_every_screen(night: Night) -> None:
    best, baseline = night.sweep.best_metric, night.sweep.baseline_metric
    assert best is not None and baseline is not None
    assert (night.json["best"], night.json["baseline"]) == (best, baseline)
    rows, table = night.table
    kept = any(e.status is S.KEPT and not e.is_baseline for e in night.exps)
    assert (f"-> best {best:.6f} (on " if kept else f"baseline {baseline:.6f} (") in table
    status = rows_of(night.cli("status", "--all"))[night.name]
    assert (status[7], status[8]) == (f"{baseline:.6f}", f"{best:.6f}")
    report = night.cli("report", "--sweep", night.name)
    assert f"**{night.metric} {baseline:.6f} → {best:.6f}**" in report
    header = text_of(night.pages["sweep"], "best")
    assert header.startswith(f"{baseline:.6f}") and f"→ {best:.6f}" in header
    n = re.search(r"→ \S+ \(on (\d+) runs?\)", header)
    assert n is not None and f"best n={n.group(1)}" in report
    assert f"(on {n.group(1)} run" in (table.split("-> best")[1] if kept else
                                       table.split(f"baseline {baseline:.6f}")[1])
    # the plot's best line ends at the best now
    line = re.search(r'class="best" data-best="([^"]+)"', night.pages["sweep"])
    assert line is not None and line.group(1) == f"{best:.6f}"


def test_the_counts_read_the_same_on_every_screen(night: Night) -> None:
    changes = [e for e in night.exps if not e.is_baseline]
    kept = sum(e.status is S.KEPT for e in changes)
    tried = sum(e.status in (S.KEPT, S.DISCARDED, S.CRASHED, S.TIMEOUT) for e in changes)
    runs = sum(r.status is not RunStatus.RUNNING for r in night.runs.values())
    aside = sum(r.status is RunStatus.SUSPECT for r in night.runs.values())
    counts = night.json["counts"]
    assert (counts["kept"], counts["tried"], counts["runs"], counts["set_aside"]) == (
        kept, tried, runs, aside)
    _, table = night.table
    said = f"{kept} of {tried} change{'s' if tried != 1 else ''} kept (the baseline aside)"
    assert said in table
    assert said in night.cli("report", "--sweep", night.name)
    # the runs set aside, row by row (its own, and its re-runs as the incumbent), add up to the
    # night's
    rows, _ = night.table
    per_row = [re.findall(r"(\d+) set aside", row[4]) for row in rows.values() if row[0].isdigit()]
    assert sum(int(n) for found in per_row for n in found) == aside
    status = rows_of(night.cli("status", "--all"))[night.name]
    assert (status[2], status[3], status[6]) == (
        str(tried), str(kept), f"{runs} ({aside} set aside)" if aside else str(runs))
    assert text_of(night.pages["sweep"], "counts").split(" / ")[0] == str(kept)
    assert text_of(night.pages["sweep"], "tried").startswith(f"{tried} / ")
    assert f"{runs} runs" + (f", {aside} set aside" if aside else "") in \
        text_of(night.pages["sweep"], "tried")


def test_sigma_now_is_named_so_and_each_reason_names_its_reference(night: Night) -> None:
    sigma = night.json["evidence"]["sigma"]
    _, table = night.table
    assert f"σ̂ now {sigma:.3g} {night.metric} (" in table  # with its unit
    assert text_of(night.pages["sweep"], "sigma").startswith(f"{sigma:.3g} ")
    for e in night.exps:
        record = e.record
        assert record is not None
        if record.ending not in (Ending.KEPT, Ending.NOT_BETTER) or record.sigma is None:
            continue
        # the σ̂ a reason quotes is its decision's (its record's), and it names what it was
        # compared with: the incumbent's runs, never "the best"
        assert f"σ̂ {record.sigma:.3g}, {record.df} df" in (e.reason or ""), e.reason
        assert "the incumbent's" in (e.reason or "") and "vs best" not in (e.reason or "")
        page = night.pages[f"exp{e.id}"]
        assert f"σ̂ at its decision {record.sigma:.3g}, {record.df} df" in \
            text_of(page, "difference")


def test_each_term_a_newcomer_meets_is_explained_where_it_appears(night: Night) -> None:
    """σ̂, df, P(better), incumbent, Δ: a legend line under the console's table, a tooltip where
    each appears on the dashboard and a list at the page's end, a section at the report's end;
    each the one sentence agent.analysis.words has for it."""
    from html import escape

    from agent.analysis.words import TERMS, term

    _, table = night.table
    flat = " ".join(table.split())
    for key in ("measured", "delta", "incumbent", "p_better", "sigma", "df"):
        assert " ".join(term(key).split()) in flat, key
    sweep = night.pages["sweep"]
    for key, shown in (("sigma", "σ̂"), ("df", "df"), ("p_better", "P(better)"),
                       ("incumbent", "incumbent"), ("delta", "Δ"), ("measured", "measured")):
        title = escape(TERMS[key][1], quote=True).replace("&#x27;", "&#39;")
        assert f'<abbr class="term" title="{title}">{shown}</abbr>' in sweep, key
    words = text_of(sweep, "words")
    assert all(TERMS[k][0] in words for k in ("sigma", "p_better", "incumbent", "set_aside"))
    judged = 0
    for e in night.exps:
        record = e.record
        page = night.pages[f"exp{e.id}"]
        assert 'id="words"' in page
        if record is not None and record.p_better is not None and record.sigma is not None \
                and record.incumbent:
            judged += 1
            assert ">P(better)</abbr> " in page and ">σ̂</abbr> at its decision" in page, e.id
    assert judged, "the night has changes judged on σ̂"
    assert 'id="words"' in night.pages["report"]
    assert "## What the words mean" in night.cli("report", "--sweep", night.name)


def test_the_digest_gains_are_the_records(night: Night) -> None:
    report = night.cli("report", "--sweep", night.name)
    if "### Near-misses" not in report:
        assert night.recorded, "the fixture's night has near-misses"
        return
    misses = report.split("### Near-misses")[1].split("###")[0]
    lines = [line for line in misses.splitlines() if line.startswith("- #")]
    assert lines
    for line in lines:
        eid = int(re.match(r"- #(\d+)", line).group(1))  # type: ignore[union-attr]
        record = next(e for e in night.exps if e.id == eid).record
        assert record is not None and record.difference is not None
        gain = record.gain(minimize=night.sweep.direction.value == "minimize")
        assert gain is not None
        if gain == 0:
            assert "equal to the incumbent runs it was compared with" in line
            continue
        word = "better" if gain > 0 else "worse"
        assert f"{word} than the incumbent runs it was compared with by {abs(gain):.6f}" in line


def test_an_ending_is_built_in_one_place_and_no_screen_reads_a_sentence() -> None:
    """Every way an experiment ends is a Verdict, made into what is written in one function
    (agent.rules.endings.finish_of); no code reads a reason's or a note's words back."""
    built, parsed = [], []
    for path in [*ROOT.glob("agent/**/*.py"), *ROOT.glob("api/**/*.py"),
                 *ROOT.glob("db/**/*.py"), *ROOT.glob("overnight/**/*.py")]:
        text = path.read_text()
        where = str(path.relative_to(ROOT))
        if re.search(r"\bFinish\(", text) and where != "agent/rules/endings.py":
            built.append(where)
        if re.search(r"\.(reason|note)\b[^\n]*\.(startswith|endswith)\(|reason_fraction|"
                     r"INTERRUPT_PREFIX\)", text):
            parsed.append(where)
    assert built == [] and parsed == []
