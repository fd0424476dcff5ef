"""Secondary metrics (`[target] secondary`) on a real night: the load trainer prints
peak_vram_mb and tokens_per_s on every run and mfu_percent on odd seeds only, through the real
loop on a machine whose speed changes under it (tests/load_world.py), so some runs are set
aside. Each screen that shows the metric shows each key's mean over exactly the runs the
experiment's record names (its value's runs), to four significant digits, "–" when none of
them printed it; a run set aside is in no mean.
"""

from __future__ import annotations

import io
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from browser_helpers import make_app, serve
from conftest import make_target
from load_world import load_night
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from rich.console import Console
from test_cli import run
from test_one_record import Night, rows_of, text_of

from agent.core.domain import Experiment, ExperimentStatus, RunStatus, Sweep
from db.store import SqlStore
from overnight.console import LineLog, LiveView

KEYS = ("peak_vram_mb", "tokens_per_s", "mfu_percent")
S = ExperimentStatus


@dataclass
class Heard:
    """What the console printed as the night went: the LineLog's lines (off a terminal) and
    each frame of the live view's "recent" table after an experiment finished (on one)."""

    log: io.StringIO = field(default_factory=io.StringIO)
    frames: list[str] = field(default_factory=list)

    def listen(self, store: SqlStore, sweep: Sweep) -> Any:
        def runs_of(experiment_id: int) -> list[Any]:  # as overnight run reads them
            return store.list_runs(experiment_id=experiment_id)

        lines = LineLog(Console(file=self.log, width=400), sweep, runs_of)
        live = LiveView(Console(file=io.StringIO(), width=400), sweep, runs_of)

        def hear(kind: str, exp: Experiment, data: dict[str, Any]) -> None:
            lines.on_event(kind, exp, data)
            live.on_event(kind, exp, data)
            if kind == "finished":
                frame = io.StringIO()
                Console(file=frame, width=400, color_system=None).print(live.render())
                self.frames.append(frame.getvalue())
        return hear


@dataclass
class HeardNight(Night):
    heard: Heard = field(default_factory=Heard)


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> HeardNight:
    # the machine moves between three speeds every 3 runs: the baseline and a kept change have
    # runs set aside (a change whose pairs agree on its speed at two machine speeds is placed)
    heard = Heard()
    store, sweep_id, db = load_night(tmp_path_factory.mktemp("secondary"), proposals=10,
                                     gains={3: 0.08, 6: 0.05}, incumbent_every=3,
                                     machine_speeds=((0.6, 1.0, 0.8), 3), secondary=KEYS,
                                     listen=heard.listen)
    return HeardNight(store, sweep_id, db, heard=heard)


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


def test_the_kept_stack_gives_each_keep_its_means(night):
    sweep = night.pages["sweep"]
    stack = re.search(r'<ol class="stack">(.*?)</ol>', sweep, re.S)
    assert stack is not None
    kept = [e for e in night.exps if e.status is S.KEPT]
    assert len(kept) >= 2
    for e in kept:
        item = re.search(rf'<summary><a href="/ui/experiments/{e.id}">#{e.id}</a>(.*?)</summary>',
                         stack.group(1), re.S)
        assert item is not None, e.id
        got = dict(re.findall(r'data-key="([^"]+)"[^>]*>[^ <]+ ([^<]+)</span>', item.group(1)))
        assert got == {key: shown(expected(night, e, key)[0]) for key in KEYS}, e.id


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
    """A night whose target names no secondary key: `secondary` null in the JSON (each run's
    too) and the API, no column on the console, tsv-full, the dashboard or the report; the
    night above has exactly its keys' columns more, each where the others stand."""
    store, sweep_id, db = load_night(tmp_path_factory.mktemp("plain"), proposals=3,
                                     gains={2: 0.08}, incumbent_every=3)
    plain = Night(store, sweep_id, db)
    assert plain.sweep.config.secondary == ()
    for row in plain.json["experiments"]:
        assert row["secondary"] is None
        assert all(r["secondary"] is None for r in row["run_records"])
    with serve(make_app(plain.db)) as base, httpx.Client(base_url=base, timeout=30) as http:
        for e in plain.exps:
            got = http.get(f"/experiments/{e.id}").json()
            assert got["secondary"] is None and got["run_records"]
            assert all(r["secondary"] is None for r in got["run_records"])

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


def means_json(night: Night, e: Experiment) -> dict[str, dict[str, Any]]:
    """{key: {"mean": …, "n": …}} as the API, the MCP tools and results json give it."""
    out = {}
    for key in KEYS:
        mean, n = expected(night, e, key)
        out[key] = {"mean": None if mean is None else pytest.approx(mean), "n": n}
    return out


def test_the_api_gives_each_experiment_its_means_and_each_run_its_own_values(night):
    """GET /experiments/{id} and the list, through the real server: `secondary` is each key's
    mean over the runs the record names (the same numbers as results json), and each run of
    `run_records`, the set-aside ones too, carries its own value; the schema says so."""
    with serve(make_app(night.db)) as base, httpx.Client(base_url=base, timeout=30) as http:
        listed = http.get("/experiments", params={"sweep": night.name, "limit": 200}).json()
        every = http.get("/experiments", params={"limit": 200}).json()  # no sweep named
        one = {e.id: http.get(f"/experiments/{e.id}").json() for e in night.exps}
        schema = http.get("/openapi.json").json()["components"]["schemas"]
    by_id = {row["id"]: row for row in listed["data"]}
    results = {row["id"]: row for row in night.json["experiments"]}
    assert set(by_id) == {e.id for e in night.exps}
    assert every["data"] == listed["data"]
    for e in night.exps:
        assert by_id[e.id]["secondary"] == means_json(night, e), e.id
        assert one[e.id]["secondary"] == means_json(night, e), e.id
        assert one[e.id]["secondary"] == results[e.id]["secondary"]  # one number everywhere
        assert by_id[e.id]["run_records"] is None  # runs come with one experiment only
        runs = one[e.id]["run_records"]
        assert [r["id"] for r in runs] == [r.id for r in night.runs.values()
                                           if r.experiment_id == e.id]
        for r in runs:
            summary = night.runs[r["id"]].summary
            assert r["secondary"] == {k: summary.get(k) for k in KEYS}, (e.id, r["id"])
        assert results[e.id]["run_records"] == runs
    view = schema["ExperimentView"]["properties"]["secondary"]
    assert {"$ref": "#/components/schemas/SecondaryValue"} in [
        branch.get("additionalProperties") for branch in view["anyOf"]]
    assert schema["SecondaryValue"]["required"] == ["mean", "n"]
    assert "secondary" in schema["RunView"]["properties"]


def test_the_mcp_tools_give_the_means(night):
    """Over the real server's MCP mount: list_experiments and wait_for_experiment carry each
    experiment's means (wait_for_experiment each run's own values too), and
    get_results_table has the tsv-full columns of each key."""

    async def call(base: str) -> tuple[dict[str, Any], dict[int, dict[str, Any]], str]:
        async with httpx.AsyncClient(timeout=60) as http, \
                streamable_http_client(f"{base}/mcp", http_client=http) as (read, write, _), \
                ClientSession(read, write) as session:
            await session.initialize()

            async def tool(name: str, **args: Any) -> Any:
                got = await session.call_tool(name, args)
                assert not got.isError, got.content
                text = got.content[0].text  # type: ignore[union-attr]
                return text if name == "get_results_table" else json.loads(text)

            listed = await tool("list_experiments", sweep=night.name, limit=500)
            waited = {e.id: await tool("wait_for_experiment", id=e.id, timeout_s=0)
                      for e in night.exps}
            return listed, waited, await tool("get_results_table", sweep=night.name)

    with serve(make_app(night.db)) as base:
        listed, waited, table = anyio.run(call, base)
    by_id = {row["id"]: row for row in listed["data"]}
    for e in night.exps:
        assert by_id[e.id]["secondary"] == means_json(night, e), e.id
        assert waited[e.id]["secondary"] == means_json(night, e), e.id
        for r in waited[e.id]["run_records"]:
            summary = night.runs[r["id"]].summary
            assert r["secondary"] == {k: summary.get(k) for k in KEYS}
    lines = [line for line in table.splitlines() if not line.startswith("#")]
    assert lines[0] == night.cli("results", "--sweep", night.name, "--format",
                                 "tsv-full").splitlines()[0]
    assert lines[0].split("\t")[-6:] == [c for k in KEYS for c in (k, f"{k}_n")]
    rows = {row.split("\t")[0]: row.split("\t") for row in lines[1:]}
    for e in night.exps:
        if e.commit and e.status in (S.KEPT, S.DISCARDED):
            for i, key in enumerate(KEYS):
                mean, n = expected(night, e, key)
                assert rows[e.commit[:7]][-6 + 2 * i:][:2] == [
                    "" if mean is None else shown(mean), str(n)], (e.id, key)


def said(night: Night, e: Experiment) -> str:
    """The keys' means as the console's line says them: "peak_vram_mb 1081  tokens_per_s …"."""
    return "  ".join(f"{key} {shown(expected(night, e, key)[0])}" for key in KEYS)


def test_the_line_log_says_each_finished_experiments_means(night):
    """Off a terminal, the line printed as each experiment finished names each key's mean over
    the runs its record names (set-aside runs in none), after its training time."""
    lines = night.heard.log.getvalue().splitlines()
    for e in night.exps:
        line = next((x for x in lines if x.startswith(f"#{e.id} ")), None)
        assert line is not None, e.id
        assert re.search(rf"train \d+\.\ds  {re.escape(said(night, e))}  ", line), line
    assert len(lines) == len(night.exps)


def test_the_live_views_recent_table_has_a_column_per_key(night):
    """On a terminal, each frame of the live view drawn after an experiment finished: the
    "recent" table's columns of the keys, each row's value its mean, as `results` prints."""
    frames = night.heard.frames
    assert len(frames) == len(night.exps)
    by_id = {e.id: e for e in night.exps}
    results, _ = night.table
    for frame in frames:
        head = console_head(frame)
        at = {key: head.index(f"{key} (measured)") for key in KEYS}
        rows = {i: cells for i, cells in rows_of(frame).items() if i.isdigit()}
        assert rows and len(rows) <= 12
        for i, cells in rows.items():
            for key in KEYS:
                value = shown(expected(night, by_id[int(i)], key)[0])
                assert cells[at[key]] == value == results[i][at[key]], (i, key)


def test_overnight_run_prints_the_means_on_each_line(tmp_path: Path):
    """`overnight run` off a terminal (its LineLog): a target whose runs print a seed-dependent
    peak_memory_mb names it and num_steps as secondary; each experiment's line says the same
    means as `results --format json`; a key no run printed reads "–"."""
    toml = (Path(__file__).parent / "fixtures" / "fake_target" / "overnight.toml").read_text()
    train = (Path(__file__).parent / "fixtures" / "fake_target" / "train.py").read_text()
    assert 'print("peak_memory_mb:   2048.0")' in train
    target = make_target(tmp_path / "target", edits={
        "overnight.toml": toml.replace("timeout_s = 20", 'timeout_s = 20\nsecondary = '
                                       '["peak_memory_mb", "num_steps", "tokens_per_s"]'),
        "train.py": train.replace('print("peak_memory_mb:   2048.0")',
                                  'print(f"peak_memory_mb:   {2000.5 + seed:.1f}")')})
    db = str(tmp_path / "o.db")
    out = run("run", "--target", str(target), "--experiments", "2", "--db", db, "--sweep",
              "sec").stdout
    rows = json.loads(run("results", "--sweep", "sec", "--format", "json", "--db", db).stdout)
    finished = [row for row in rows["experiments"] if row["status"] in ("kept", "discarded")]
    assert len(finished) >= 2
    for row in finished:
        means = row["secondary"]
        assert means["tokens_per_s"] == {"mean": None, "n": 0}
        assert means["num_steps"]["mean"] == 3.0
        assert means["peak_memory_mb"]["n"] == row["n"] >= 1
        text = "  ".join(f"{k} {shown(m['mean'])}" for k, m in means.items())
        line = next(x for x in out.splitlines() if x.startswith(f"#{row['id']} "))
        assert f"  {text}  " in line, line
    base = next(row for row in finished if row["is_baseline"])  # its runs, seeds 42, 43 …
    assert base["n"] > 1 and 2042.5 < base["secondary"]["peak_memory_mb"]["mean"] < 2050
