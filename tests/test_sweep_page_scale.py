"""The sweep page at 10,000 experiments (a real SQLite file, rows bulk-inserted), and the plot's
downsampler as a pure function: every kept run stays a mark, the rest keep their envelope."""

from __future__ import annotations

import math
import random
import re
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from browser_helpers import make_app, table_ids
from bulk_seed import seed_sweep
from dashboard_oracles import progress_svg
from fastapi.testclient import TestClient
from test_query_plans import captured, check_plans

from agent.core.domain import Experiment, ExperimentStatus, Finish, Proposal, utcnow
from api.dashboard.plot import MAX_MARKS, PlotPoint, downsample
from api.dashboard.views import KEPT_SHOWN, PAGE_SIZE
from db.engine import open_database
from db.store import SqlStore

S = ExperimentStatus
N = 10_000
PAGE_LIMIT = 500 * 1024


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return seed_sweep(tmp_path_factory.mktemp("big"), N)


def _link(html: str, rel: str) -> str:
    m = re.search(rf'<a href="\?([^"]+)#experiments" rel="{rel}">', html)
    assert m, f"no {rel} link"
    return m[1].replace("&amp;", "&")


def test_the_page_renders_small_with_every_kept_point(big: Path) -> None:
    store = SqlStore(open_database(big))
    kept = {e.id for e in store.list_experiments(1, [S.KEPT])}
    with TestClient(make_app(big)) as c:
        r = c.get("/ui/sweeps/big")
    assert r.status_code == 200 and len(r.content) <= PAGE_LIMIT, len(r.content)
    html = r.text
    drawn = {int(i) for i in re.findall(r'class="pt kept" href="[^"]*" data-id="(\d+)"', html)}
    assert len(kept) > 100 and drawn == kept
    assert '<path class="envelope" d="M' in html and f"of {N:,} runs drawn" in html
    assert html.count('class="pt ') < MAX_MARKS + len(kept)
    assert table_ids(html) == sorted(table_ids(html), reverse=True)
    assert len(table_ids(html)) == PAGE_SIZE and f"page 1 of {math.ceil(N / PAGE_SIZE)}" in html
    stack = html.split('<ol class="stack">')[1].split("</ol>")[0]
    assert stack.count("<li>") == KEPT_SHOWN and f"of {len(kept)} kept changes" in html


def test_a_fresh_page_works_out_each_commits_value_once(big: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The first view folds the whole sweep: a commit's recorded value (its runs in their
    machine conditions) is worked out once, not once for every experiment that shares it
    (here all 10,000 do)."""
    import agent.analysis.evidence as evidence

    calls: list[str] = []
    real = evidence.recorded_best

    def counted(runs, commit, *args):  # type: ignore[no-untyped-def]
        calls.append(commit)
        return real(runs, commit, *args)

    monkeypatch.setattr(evidence, "recorded_best", counted)
    with TestClient(make_app(big)) as c:
        c.get("/ui/sweeps/big").raise_for_status()
    assert calls and len(calls) == len(set(calls)), Counter(calls).most_common(2)


def test_cursor_pages_walk_the_table_both_ways(big: Path) -> None:
    with TestClient(make_app(big)) as c:
        first = c.get("/ui/sweeps/big?status=crashed").text
        ids1 = table_ids(first)
        second = c.get(f"/ui/sweeps/big?{_link(first, 'next')}").text
        ids2 = table_ids(second)
        assert len(ids2) == PAGE_SIZE and max(ids2) < min(ids1) and "page 2 of" in second
        back = c.get(f"/ui/sweeps/big?{_link(second, 'prev')}").text
        assert table_ids(back) == ids1 and "page 1 of" in back and 'rel="prev"' not in back
        # The crashed filter: crashes and timeouts only, newest first.
        body = second.split('id="experiments"')[1].split("</table>")[0]
        assert set(re.findall(r'<tr class="r-(\w+)"', body)) <= {"crashed", "timeout"}


def test_table_queries_read_index_ranges(big: Path) -> None:
    with TestClient(make_app(big)) as c, captured() as seen:
        for status in ("all", "kept", "crashed", "queued", "other"):
            page = c.get(f"/ui/sweeps/big?status={status}").text
            if 'rel="next"' in page:
                c.get(f"/ui/sweeps/big?{_link(page, 'next')}").raise_for_status()
    assert check_plans(big, seen) >= 10


def test_a_change_shows_at_once(tmp_path: Path) -> None:
    """The cached summary is redrawn when the sweep changes: a new keep is on the plot."""
    db = seed_sweep(tmp_path, 2 * MAX_MARKS)
    store = SqlStore(open_database(db))
    with TestClient(make_app(db)) as c:
        before = c.get("/ui/sweeps/big").text
        diff = "--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-a\n+b\n"
        exp = store.add_experiment(1, Proposal("a fresh keep", diff))
        assert f'data-id="{exp.id}"' not in before
        store.claim(exp.id)
        store.finish(exp.id, Finish(S.KEPT, metric=0.5, best_before=1.0, best=0.5),
                     keep_commit="f" * 40)
        after = c.get("/ui/sweeps/big").text
    assert re.search(rf'class="pt kept" href="[^"]*" data-id="{exp.id}"', after)
    assert table_ids(after)[0] == exp.id


# --- the downsampler, pure ----------------------------------------------------------------------
def _points(n: int, seed: int) -> list[PlotPoint]:
    rng = random.Random(seed)
    out = []
    for i in range(1, n + 1):
        roll = rng.random()
        status = S.KEPT if roll < 0.05 else S.CRASHED if roll < 0.12 else \
            S.TIMEOUT if roll < 0.14 else S.DISCARDED
        metric = None if status in (S.CRASHED, S.TIMEOUT) else rng.gauss(1.0, 0.1)
        if status is S.DISCARDED and roll > 0.995:
            metric = float("nan")  # a discarded run without a finite metric
        out.append(PlotPoint(i, Experiment(id=i, sweep_id=1, status=status, description="d",
                                           diff="", proposer="p", metric=metric)))
    return out


@pytest.mark.parametrize("n, buckets", [(5000, 160), (1001, 7), (30, 160)])
def test_downsample_keeps_kept_points_and_the_envelope(n: int, buckets: int) -> None:
    points = _points(n, seed=n)
    shown, envelopes = downsample(points, buckets)
    ids = [p.n for p in shown]
    assert ids == sorted(set(ids))  # run order, no repeats
    assert {p.n for p in points if p.exp.status is S.KEPT} <= set(ids)
    finite = [p for p in points if p.exp.status is S.DISCARDED and p.exp.metric is not None
              and math.isfinite(p.exp.metric)]
    for p in finite:  # each non-kept scored run lies inside its bucket's envelope
        env = next(e for e in envelopes if e.n_lo <= p.n <= e.n_hi)
        assert env.lo <= p.exp.metric <= env.hi  # type: ignore[operator]
    by_n = {p.n: p for p in shown}
    for env in envelopes:  # and each envelope's extremes are real runs drawn as marks
        inside = [by_n[k].exp.metric for k in by_n if env.n_lo <= k <= env.n_hi
                  and by_n[k].exp.status is S.DISCARDED]
        assert env.lo in inside and env.hi in inside
    assert sum(e.n_hi >= e.n_lo for e in envelopes) == len(envelopes) <= buckets
    for status in (S.CRASHED, S.TIMEOUT):  # every bucket with a crash keeps one
        assert any(p.exp.status is status for p in shown) == any(
            p.exp.status is status for p in points)
    kept = sum(p.exp.status is S.KEPT for p in points)
    assert len(shown) <= kept + 5 * buckets  # min, max; first crash, timeout, unscored


def test_a_small_plot_is_not_downsampled() -> None:
    points = _points(200, seed=1)
    svg = str(progress_svg([p.exp for p in points], "m"))
    runs = [p for p in points if p.exp.status in (S.KEPT, S.DISCARDED, S.CRASHED, S.TIMEOUT)]
    assert svg.count('class="pt ') == len(runs) and "envelope" not in svg


# --- the experiment page and the overview read what they show ---------------------------------
def _reads(db: Path, statements: list[tuple[str, object]]) -> list[tuple[str, int]]:
    """(statement, rows it returns) of each SELECT on experiments, run again on the file."""
    con = sqlite3.connect(db)
    try:
        return [(sql, len(con.execute(sql, params or ()).fetchall()))  # type: ignore[arg-type]
                for sql, params in statements
                if sql.lstrip().upper().startswith("SELECT") and "FROM experiments" in sql]
    finally:
        con.close()


def test_the_experiment_page_reads_its_own_rows(big: Path) -> None:
    store = SqlStore(open_database(big))
    mid = store.list_experiments(1, [S.DISCARDED], limit=1, before_id=N // 2,
                                 newest_first=True)[0]
    ran = [S.KEPT, S.DISCARDED, S.CRASHED, S.TIMEOUT]
    run_no = sum(1 for e in store.list_experiments(1) if e.id <= mid.id and e.status in ran)
    with TestClient(make_app(big)) as c:
        c.get("/ui/sweeps/big").raise_for_status()  # the sweep's evidence is cached
        with captured() as seen:
            html = c.get(f"/ui/experiments/{mid.id}").text
    assert f'href="/ui/experiments/{mid.id - 1}" rel="prev"' in html
    assert f'href="/ui/experiments/{mid.id + 1}" rel="next"' in html
    assert f"<dt>Run order</dt><dd>{run_no} of the sweep</dd>" in html
    assert "(the mean of 1 run)" in html
    assert check_plans(big, seen) >= 3
    reads = _reads(big, seen)
    assert reads and max(n for _, n in reads) <= 1, reads  # one row per lookup, no sweep


def test_the_overview_reads_one_row_per_sweep(big: Path) -> None:
    from api.dashboard.views import Rollup, rollups
    from db.reads import Reads
    from db.store import SqlStore as Store

    store = Store(open_database(big))
    sweeps = store.list_sweeps()
    walked = {s.id: Rollup() for s in sweeps}  # what the page summed before: every row
    now = utcnow()
    for e in store.list_experiments():
        walked[e.sweep_id].add(e.status.value, e.run_started_at, e.run_ended_at, now)
    got = rollups(Reads(store), sweeps)
    assert {k: r.counts for k, r in got.items()} == {k: r.counts for k, r in walked.items()}
    assert {k: round(r.train_s, 3) for k, r in got.items()} == {
        k: round(r.train_s, 3) for k, r in walked.items()}
    with TestClient(make_app(big)) as c, captured() as seen:
        html = c.get("/").text
    hours = f"{walked[1].train_s / 3600:.1f}"
    tried = sum(walked[1].counts[s.value] for s in (S.KEPT, S.DISCARDED, S.CRASHED, S.TIMEOUT)) - 1
    assert f"{tried:,}".replace(",", "") in html.replace(",", "") and hours in html
    reads = _reads(big, seen)
    assert reads and all(n <= len(sweeps) for _, n in reads), reads
    assert check_plans(big, seen) >= 1  # and no scan of experiments to find them
