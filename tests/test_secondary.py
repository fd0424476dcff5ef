"""Secondary metrics (`[target] secondary`) on a real night: the load trainer prints
peak_vram_mb and tokens_per_s on every run and mfu_percent on odd seeds only, through the real
loop on a machine whose speed changes under it (tests/load_world.py), so some runs are set
aside. Each screen that shows the metric shows each key's mean over exactly the runs the
experiment's record names (its value's runs), to four significant digits, "–" when none of
them printed it; a run set aside is in no mean.
"""

from __future__ import annotations

import re
import statistics

import pytest
from load_world import load_night
from test_one_record import Night, text_of

from agent.core.domain import Experiment, ExperimentStatus, RunStatus

KEYS = ("peak_vram_mb", "tokens_per_s", "mfu_percent")
S = ExperimentStatus


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> Night:
    # the machine switches every 3 runs: the baseline and a kept change have runs set aside
    store, sweep_id, db = load_night(tmp_path_factory.mktemp("secondary"), proposals=10,
                                     gains={3: 0.08, 6: 0.05}, incumbent_every=3,
                                     machine_speeds=((0.6, 1.0), 3), secondary=KEYS)
    return Night(store, sweep_id, db)


def expected(night: Night, e: Experiment, key: str) -> tuple[float | None, int]:
    """The mean of the key over the runs e's record names that printed it, and how many."""
    record = e.record
    assert record is not None
    values = [night.runs[i].summary[key] for i in record.change.runs
              if key in night.runs[i].summary]
    return (statistics.fmean(values) if values else None), len(values)


def console_head(table: str) -> list[str]:
    """The console table's column titles, a title wrapped over lines joined again."""
    lines = [[c.strip() for c in line.strip("┃").split("┃")]
             for line in table.splitlines() if line.startswith("┃")]
    return [" ".join(p for p in parts if p) for parts in zip(*lines, strict=True)]


def shown(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"  # no exponent


def test_the_night_has_changes_with_runs_set_aside_and_keys_some_runs_did_not_print(night):
    assert night.sweep.config.secondary == KEYS
    aside = [e for e in night.exps if e.record and e.record.set_aside and e.record.change.n]
    assert any(not e.is_baseline and e.status is S.KEPT for e in aside), \
        "a kept change with a run set aside beside the runs its value rests on"
    # a set-aside run's own value (or a re-run's as the incumbent) would move the mean
    for e in aside:
        assert e.record is not None
        every = [r for r in night.runs.values() if r.experiment_id == e.id]
        assert len(every) > e.record.n
        with_aside = statistics.fmean(r.summary["peak_vram_mb"] for r in every)
        assert with_aside != pytest.approx(expected(night, e, "peak_vram_mb")[0])
    assert any(expected(night, e, "mfu_percent") == (None, 0) and e.record and e.record.n
               for e in night.exps), "a change none of whose runs printed mfu_percent"
    assert any(r.status is RunStatus.SUSPECT for r in night.runs.values())


def test_results_json_and_tsv_full_give_the_mean_of_the_records_runs(night):
    by_id = {row["id"]: row for row in night.json["experiments"]}
    lines = night.cli("results", "--sweep", night.name, "--format", "tsv-full").splitlines()
    head = lines[0].split("\t")
    assert head[-6:] == ["peak_vram_mb", "peak_vram_mb_n", "tokens_per_s", "tokens_per_s_n",
                         "mfu_percent", "mfu_percent_n"]
    for e in night.exps:
        got = by_id[e.id]["secondary"]
        assert list(got) == list(KEYS)
        for key in KEYS:
            mean, n = expected(night, e, key)
            assert got[key]["n"] == n, (e.id, key)
            assert got[key]["mean"] == (None if mean is None else pytest.approx(mean)), e.id
        if e.commit and e.status in (S.KEPT, S.DISCARDED):
            row = night.tsv[e.commit[:7]]
            for key in KEYS:
                mean, n = expected(night, e, key)
                assert (row[key], row[f"{key}_n"]) == ("" if mean is None else shown(mean),
                                                       str(n))
    # autoresearch's results.tsv keeps its exact columns
    plain = night.cli("results", "--sweep", night.name, "--format", "tsv").splitlines()[0]
    assert plain.split("\t") == ["commit", "work", "memory_gb", "status", "description"]


def test_the_console_table_has_a_measured_column_per_key(night):
    rows, table = night.table
    head = console_head(table)
    at = {key: head.index(f"{key} (measured)") for key in KEYS}
    assert head[3] == "work (measured)" and sorted(at.values()) == [7, 8, 9]
    for e in night.exps:
        for key in KEYS:
            assert rows[str(e.id)][at[key]] == shown(expected(night, e, key)[0]), (e.id, key)


def test_the_dashboard_shows_the_means_on_the_sweep_table_and_the_experiment_page(night):
    sweep = night.pages["sweep"]
    head = re.search(r'<table class="grid-table" id="experiments">\s*<thead>(.*?)</thead>',
                     sweep, re.S)
    assert head is not None
    titles = [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", t)).strip()
              for t in re.findall(r"<th[^>]*>(.*?)</th>", head.group(1), re.S)]
    assert titles[6:9] == [f"{key} (measured)" for key in KEYS]
    for e in night.exps:
        cells = re.search(rf'href="/ui/experiments/{e.id}">{e.id}</a></td>(.*?)</tr>', sweep,
                          re.S)
        assert cells is not None
        tds = [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", c)).strip()
               for c in re.findall(r"<td[^>]*>(.*?)</td>", cells.group(1), re.S)]
        assert tds[5:8] == [shown(expected(night, e, key)[0]) for key in KEYS], e.id
        page = night.pages[f"exp{e.id}"]
        record = e.record
        assert record is not None
        for key in KEYS:
            mean, n = expected(night, e, key)
            dd = text_of(page, f"secondary-{key}")
            assert dd.startswith(shown(mean)), (e.id, key, dd)
            if n:
                named = [i for i in record.change.runs if key in night.runs[i].summary]
                assert f"(the mean of {n} run{'s' if n != 1 else ''}: " \
                       f"{', '.join(map(str, named))})" in dd
        # each run's own value in its runs table, the set-aside runs' too
        runs = re.search(r'<table class="grid-table" id="runs">(.*?)</table>', page, re.S)
        assert runs is not None
        for i in [*record.change.runs, *record.set_aside]:
            row = re.search(rf'<tr[^>]*><td class="num">{i}</td>(.*?)</tr>', runs.group(1),
                            re.S)
            assert row is not None, (e.id, i)
            tds = [re.sub(r"<[^>]+>", "", c).strip()
                   for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)]
            summary = night.runs[i].summary
            assert tds[5:8] == [shown(summary.get(k)) for k in KEYS], (e.id, i)


def test_the_morning_report_gives_each_kept_change_its_means(night):
    kept = [e for e in night.exps if e.status is S.KEPT and not e.is_baseline]
    assert kept
    md = night.cli("report", "--sweep", night.name)
    head = next(line for line in md.splitlines() if line.startswith("| # | change |"))
    assert [c.strip() for c in head.split("|")][7:10] == [
        f"{key}: mean of its runs (measured)" for key in KEYS]
    html = night.pages["report"]
    for e in kept:
        row = next(line for line in md.splitlines() if line.startswith(f"| {e.id} |"))
        cells = [c.strip() for c in row.split("|")]
        assert cells[7:10] == [shown(expected(night, e, key)[0]) for key in KEYS], row
        found = re.search(rf'<tr id="exp-{e.id}">(.*?)</tr>', html, re.S)
        assert found is not None
        tds = [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", c)).strip()
               for c in re.findall(r"<td[^>]*>(.*?)</td>", found.group(1), re.S)]
        assert tds[6:9] == [shown(expected(night, e, key)[0]) for key in KEYS], tds


def test_without_the_key_the_screens_are_as_before_and_with_it_only_its_columns_are_added(
        night, tmp_path_factory: pytest.TempPathFactory):
    """A night whose target names no secondary key: no `secondary` in the JSON, no column on
    the console, tsv-full, the dashboard or the report; the night above has exactly its keys'
    columns more, each where the others stand."""
    store, sweep_id, db = load_night(tmp_path_factory.mktemp("plain"), proposals=3,
                                     gains={2: 0.08}, incumbent_every=3)
    plain = Night(store, sweep_id, db)
    assert plain.sweep.config.secondary == ()
    assert all("secondary" not in row for row in plain.json["experiments"])

    def heads(n: Night) -> dict[str, list[str]]:
        _, table = n.table
        tsv = n.cli("results", "--sweep", n.name, "--format", "tsv-full").splitlines()[0]
        md = n.cli("report", "--sweep", n.name)
        th = re.search(r'id="experiments">\s*<thead>(.*?)</thead>', n.pages["sweep"], re.S)
        assert th is not None
        return {
            "console": console_head(table),
            "tsv": tsv.split("\t"),
            "md": [c.strip() for c in next(line for line in md.splitlines()
                                           if line.startswith("| # | change |")).split("|")],
            "page": [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", t)).strip()
                     for t in re.findall(r"<th[^>]*>(.*?)</th>", th.group(1), re.S)],
        }

    before, after = heads(plain), heads(night)
    measured = [f"{key} (measured)" for key in KEYS]
    assert after["console"] == before["console"][:7] + measured + before["console"][7:]
    assert after["page"] == before["page"][:6] + measured + before["page"][6:]
    assert after["tsv"] == before["tsv"] + [c for k in KEYS for c in (k, f"{k}_n")]
    assert after["md"] == before["md"][:7] + [
        f"{key}: mean of its runs (measured)" for key in KEYS] + before["md"][7:]
    assert not any("(measured)" in h for h in before["console"][4:] + before["page"][3:])
