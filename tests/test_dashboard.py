"""Dashboard pages over HTTP (TestClient on the real app) and its pure helpers (diff, SVG)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from browser_helpers import (
    Filled,
    fill_direct,
    fill_sweep,
    make_app,
    serve,
    stamp_hourly,
    table_ids,
)
from dashboard_oracles import progress_svg
from fastapi.testclient import TestClient
from record_fixtures import record, recorded

from agent.core.diff import diff_stats
from agent.core.diff import view_lines as parse_diff
from agent.core.domain import Experiment, ExperimentStatus, Proposal, utcnow
from agent.core.record import Ending
from api.dashboard.plot import loss_svg
from api.dashboard.views import PAGE_SIZE

TOKEN = "t" * 24


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Filled:
    return fill_sweep(tmp_path_factory.mktemp("dash"))


@pytest.fixture(scope="module")
def client(filled: Filled) -> TestClient:
    with TestClient(make_app(filled.db)) as c:
        yield c


def _by_status(filled: Filled) -> dict[str, list[Experiment]]:
    out: dict[str, list[Experiment]] = {}
    for e in filled.store.list_experiments(filled.sweep.id):
        out.setdefault(e.status.value, []).append(e)
    return out


# --- pages on a sweep filled by the real loop -------------------------------------------------
def test_overview_row(client: TestClient, filled: Filled) -> None:
    html = client.get("/").text
    assert '<a href="/ui/sweeps/night">night</a>' in html
    row = html.split('<a href="/ui/sweeps/night">')[1].split("</tr>")[0]
    s = filled.store.get_sweep("night")
    assert f"{s.baseline_metric:.6f}" in row and f"{s.best_metric:.6f}" in row
    assert "done" in row and "8 / 8" in row
    assert client.get("/ui/").status_code == 200


def test_sweep_page_plot_table_stack(client: TestClient, filled: Filled) -> None:
    html = client.get("/ui/sweeps/night").text
    by = _by_status(filled)
    for status in ("kept", "discarded", "crashed", "timeout"):
        assert html.count(f'class="pt {status}"') == len(by[status]), status
    assert '<path class="best"' in html  # the running-best step line
    crashed = by["crashed"][0]
    assert f'href="/ui/experiments/{crashed.id}#diff"' in html
    # Table: newest first, every run listed with a link.
    ids = [int(m) for m in re.findall(r'<td class="num"><a href="/ui/experiments/(\d+)">', html)]
    assert ids == sorted(ids, reverse=True) and len(ids) == sum(len(v) for v in by.values())
    # Kept stack: baseline → best in order; the best file is shown with a download link.
    stack = html.split('<ol class="stack">')[1].split("</ol>")[0]
    kept_ids = [int(m) for m in re.findall(r'<summary><a href="/ui/experiments/(\d+)">', stack)]
    assert kept_ids == [e.id for e in by["kept"]]
    assert 'href="/ui/sweeps/night/best/train.py" download' in html


def test_sweep_page_shows_the_digest(client: TestClient, filled: Filled) -> None:
    from agent.analysis.insights_fold import digest

    html = client.get("/ui/sweeps/night").text
    panel = html.split('<section aria-labelledby="insights-h" id="insights">')[1].split(
        "</section>")[0]
    found = digest(filled.store.get_sweep("night"),
                   filled.store.list_experiments(filled.sweep.id))
    assert found.knobs, "the filled sweep changed constants"
    assert "Sweep night: what has been learned" in panel
    for knob in found.knobs:
        assert f"{knob.name} [{knob.category}] now {knob.current};" in panel
    assert found.plateau in panel
    assert 'href="/sweeps/night/insights"' in panel


def test_status_filter_and_unknown_filter(client: TestClient, filled: Filled) -> None:
    html = client.get("/ui/sweeps/night?status=crashed").text
    body = html.split('id="experiments"')[1].split("</table>")[0]
    assert body.count("<tr class=") == 2 and "r-crashed" in body and "r-timeout" in body
    bogus = client.get("/ui/sweeps/night?status=bogus")  # an unknown filter falls back to all
    assert bogus.status_code == 200
    rows = bogus.text.split('id="experiments"')[1].split("</table>")[0]
    everything = client.get("/ui/sweeps/night").text.split('id="experiments"')[1]
    total = len(filled.store.list_experiments(filled.sweep.id))
    assert rows.count("<tr class=") == everything.split("</table>")[0].count("<tr class=") == total
    assert "r-kept" in rows and "r-discarded" in rows and "r-crashed" in rows


def test_experiment_page(client: TestClient, filled: Filled) -> None:
    e = next(x for x in _by_status(filled)["kept"] if not x.is_baseline)
    html = client.get(f"/ui/experiments/{e.id}").text
    assert 'class="d-add"' in html and 'class="d-del"' in html
    assert f"refs/overnight/night/{e.id}" in html and "git -C" in html
    assert "val_bpb" in html and 'class="loss"' in html
    assert "step 3 | loss" in html  # log tail
    assert f'href="/ui/experiments/{e.id}/log.txt" download' in html
    log = client.get(f"/ui/experiments/{e.id}/log.txt")
    assert log.status_code == 200 and "---" in log.text
    assert "attachment" in log.headers["content-disposition"]


def test_crashed_experiment_page(client: TestClient, filled: Filled) -> None:
    e = _by_status(filled)["crashed"][0]
    html = client.get(f"/ui/experiments/{e.id}").text
    assert "fundamental" in html and "MemoryError" in html and "reason-box" in html


def test_best_file_download_matches_git(client: TestClient, filled: Filled) -> None:
    s = filled.store.get_sweep("night")
    r = client.get("/ui/sweeps/night/best/train.py")
    assert r.status_code == 200 and r.text == filled.repo.read_file(s.best_commit, "train.py")
    assert client.get("/ui/sweeps/night/best/prepare.py").status_code == 404


def test_not_found(client: TestClient) -> None:
    assert client.get("/ui/sweeps/nope").status_code == 404
    assert client.get("/ui/experiments/99999").status_code == 404
    assert (
        client.get("/ui/static/dashboard.js").headers["content-type"].startswith("text/javascript")
    )


def _raw_get(base: str, raw_path: str) -> tuple[int, str]:
    """GET with the path sent byte for byte (httpx and TestClient would drop the `..`)."""
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        conn.putrequest("GET", raw_path, skip_accept_encoding=True)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def test_static_path_traversal_over_the_wire(filled: Filled) -> None:
    """`..` in the raw request line reaches the real server and serves nothing outside static/."""
    with serve(make_app(filled.db)) as base:
        status, body = _raw_get(base, "/ui/static/dashboard.js")  # the channel itself works
        assert status == 200 and body
        for raw in ("/ui/static/../routes.py", "/ui/static/%2e%2e/routes.py",
                    "/ui/static/..%2froutes.py", "/ui/static/%2e%2e%2f%2e%2e%2fmain.py",
                    "/ui/static/../../../pyproject.toml"):
            status, body = _raw_get(base, raw)
            assert status == 404, (raw, status)
            assert "import" not in body and "[project]" not in body, raw


def test_api_routes_not_shadowed(client: TestClient, filled: Filled) -> None:
    """The JSON API keeps /sweeps/{name} and /experiments/{id}; the pages live under /ui."""
    r = client.get("/sweeps/night")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.json()["name"] == "night" and r.json()["best_metric"] == filled.sweep.best_metric
    r = client.get("/experiments/1")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.json()["id"] == 1 and r.json()["sweep"] == "night"


def test_live_endpoint_reads_the_growing_log(client: TestClient, filled: Filled) -> None:
    sweep = filled.store.get_sweep("night")
    exp = filled.store.add_experiment(sweep.id, Proposal("hand-made running row", ""))
    filled.store.claim(exp.id)
    log = filled.work / "manual.log"
    log.write_text("step 1 | loss 4.0 | elapsed 0.5s\nstep 2 | loss 3.0 | elapsed 1.0s\n")
    filled.store.mark_started(
        exp.id, log_path=str(log), run_started_at=utcnow() - timedelta(seconds=2)
    )
    try:
        data = client.get("/ui/sweeps/night/live").json()
        (run,) = data["running"]
        assert run["id"] == exp.id and "step 2" in run["log"] and run["last_loss"] == 3.0
        assert run["elapsed_s"] >= 2 and "<polyline" in run["loss_svg"]
        assert run["training_s"] == 1.0  # the script's own clock, apart from start-up
        with log.open("a") as fh:
            fh.write("step 3 | loss 2.5 | elapsed 1.5s\n")
        tail = client.get(f"/ui/experiments/{exp.id}/tail").json()
        assert "step 3" in tail["log"] and tail["training_s"] == 1.5
        page = client.get("/ui/sweeps/night").text
        assert f'data-exp="{exp.id}"' in page and "hand-made running row" in page
    finally:
        from agent.core.domain import Finish

        filled.store.finish(exp.id, Finish(ExperimentStatus.CANCELLED, reason="test"))
    assert client.get("/ui/sweeps/night/live").json()["running"] == []


def test_the_live_bar_counts_steps_on_a_budget_of_steps(client: TestClient,
                                                         filled: Filled) -> None:
    """A compute budget: the live panel counts the run's steps against the budget's, not
    seconds against a budget in seconds the sweep does not have."""
    from agent.core.budget import ComputeBudget
    from agent.core.ports import SweepSpec

    night = filled.store.get_sweep("night")
    sweep = filled.store.create_sweep(SweepSpec(
        "steps", night.target_path, "overnight/steps", "queue",
        night.config.with_budget(ComputeBudget(5, "steps"))))
    exp = filled.store.add_experiment(sweep.id, Proposal("a run on five steps", ""))
    filled.store.claim(exp.id)
    log = filled.work / "steps.log"
    log.write_text("step 1 | loss 4.0 | elapsed 0.5s\nstep 2 | loss 3.0 | elapsed 1.0s\n")
    filled.store.mark_started(exp.id, log_path=str(log), run_started_at=utcnow())
    try:
        (run,) = client.get("/ui/sweeps/steps/live").json()["running"]
        assert (run["done"], run["of"], run["unit"], run["budget"]) == (2, 5, "steps", "5 steps")
        assert run["budget_s"] is None or run["budget_s"] > 0
        page = " ".join(re.sub(r"<[^>]+>", " ", client.get("/ui/sweeps/steps").text).split())
        assert "step 2 of 5 steps · 1.0 s trained" in page
        assert 'aria-valuemax="5"' in client.get("/ui/sweeps/steps").text
        timed = client.get("/ui/sweeps/night").text  # a time budget keeps its seconds
        assert "s trained of" in timed or "Nothing running" in timed
    finally:
        from agent.core.domain import Finish

        filled.store.finish(exp.id, Finish(ExperimentStatus.CANCELLED, reason="test"))


# --- pagination and speed on a big sweep ----------------------------------------------------
def test_pagination(tmp_path: Path) -> None:
    name = fill_direct(tmp_path, 2 * PAGE_SIZE + 7, name="big")
    with TestClient(make_app(tmp_path / "big.db")) as c:
        first = c.get(f"/ui/sweeps/{name}").text
        assert "page 1 of 3" in first and 'rel="next"' in first and 'rel="prev"' not in first
        last = c.get(f"/ui/sweeps/{name}?page=3").text
        rows = last.split('id="experiments"')[1].split("</table>")[0].count("<tr class=")
        assert rows == 7 and 'rel="prev"' in last
        assert "page 3 of 3" in c.get(f"/ui/sweeps/{name}?page=99").text


def _link(html: str, rel: str) -> str:
    found = re.search(rf'<a href="([^"]+)" rel="{rel}">', html)
    assert found, f"no {rel} link"
    return f"/ui/sweeps/big{found.group(1).replace('&amp;', '&')}"


def test_time_filter_pages_keep_the_window(tmp_path: Path) -> None:
    """`since` (a span like 24h or an ISO time) filters the table on created_at; its links
    (status filters, pager) keep it; the total is not claimed; a bad value is a 422."""
    name = fill_direct(tmp_path, 2 * PAGE_SIZE + 7, name="big")
    ids = stamp_hourly(tmp_path / "big.db")  # newest first, one an hour
    with TestClient(make_app(tmp_path / "big.db")) as c:
        day = c.get(f"/ui/sweeps/{name}", params={"since": "24h"}).text
        assert table_ids(day) == ids[:24] and "24 rows created in this time window" in day
        assert re.search(r'aria-current="true" class="on">last 24 h<', day)
        assert 'href="?status=kept&amp;since=24h"' in day and 'rel="next"' not in day
        since = (utcnow() - timedelta(hours=70)).isoformat()
        first = c.get(f"/ui/sweeps/{name}", params={"since": since}).text
        assert "page 1<" in first and " of " not in first.split('class="pager"')[1][:300]
        seen = table_ids(first)
        second = c.get(_link(first, "next")).text
        seen += table_ids(second)
        assert seen == ids[:70] and 'rel="next"' not in second
        assert table_ids(c.get(_link(second, "prev")).text) == ids[:PAGE_SIZE]
        both = c.get(f"/ui/sweeps/{name}", params={"since": "70h", "until": "20h"}).text
        assert table_ids(both) == ids[20:70][:PAGE_SIZE]
        for bad, param in (({"since": "last night"}, "since"),
                           ({"since": "2h", "until": "5h"}, "until")):
            r = c.get(f"/ui/sweeps/{name}", params=bad)
            assert r.status_code == 422 and r.json()["detail"]["message"].startswith(param)


# --- auth -----------------------------------------------------------------------------------
def test_pages_need_the_token_when_reads_are_protected(filled: Filled) -> None:
    with TestClient(make_app(filled.db, token=TOKEN)) as c:
        r = c.get("/ui/sweeps/night", follow_redirects=False)
        assert r.status_code == 401  # the login form in place, back to the page once signed in
        assert 'action="/login"' in r.text and 'name="next" value="/ui/sweeps/night"' in r.text
        assert "overnight token" in r.text and "<table" not in r.text
        assert c.get("/ui/sweeps/night/live").status_code == 401
        form = c.get("/ui/login?next=/ui/sweeps/night")
        assert form.status_code == 200 and 'action="/login"' in form.text
        ok = c.get("/ui/sweeps/night", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
        c.cookies.set("overnight_token", TOKEN)
        assert c.get("/").status_code == 200


# --- pure helpers ---------------------------------------------------------------------------
DIFF = """\
--- a/train.py
+++ b/train.py
@@ -9,3 +9,3 @@
 from prepare import score
-LR = 0.01
+LR = 0.02
 WIDTH = 64
--- a/other.py
+++ b/other.py
@@ -1,2 +1,3 @@
 a = 1
+--- not a header
 b = 2
"""


def test_parse_diff_kinds_and_line_numbers() -> None:
    lines = parse_diff(DIFF)
    kinds = [x.kind for x in lines]
    assert kinds == [
        "file",
        "file",
        "hunk",
        "ctx",
        "del",
        "add",
        "ctx",
        "file",
        "file",
        "hunk",
        "ctx",
        "add",
        "ctx",
    ]
    assert (lines[4].old_no, lines[5].new_no, lines[6].old_no, lines[6].new_no) == (10, 10, 11, 11)
    assert lines[11].text == "+--- not a header"
    assert diff_stats(DIFF) == (2, 1)
    assert parse_diff("") == [] and parse_diff("garbage\n@@ bad @@\n+x")[-1].kind == "add"


def _exp(
    i: int, status: str, metric: float | None, best: float | None, desc: str = "d"
) -> Experiment:
    exp = Experiment(
        id=i,
        sweep_id=1,
        status=ExperimentStatus(status),
        description=desc,
        diff="",
        proposer="knobs",
        metric=metric,
        best_before=best,
    )
    if metric is None or best is None:
        return exp
    ending = Ending.KEPT if status == "kept" else Ending.NOT_BETTER
    return recorded(exp, record(ending, [metric], compared=[best], se=0.02))


def test_progress_svg_marks_clipping_and_escaping() -> None:
    exps = [
        _exp(1, "kept", 1.0, None),
        _exp(2, "discarded", 1.1, 1.0),
        _exp(3, "crashed", None, 1.0, "<script>alert(1)</script>"),
        _exp(4, "kept", 0.9, 1.0),
        _exp(5, "discarded", 50.0, 0.9),  # a wild outlier
        _exp(6, "queued", None, None),
        _exp(7, "rejected", None, None),
    ]
    svg = str(progress_svg(exps, "val_bpb"))
    assert svg.count('class="pt ') == 5  # queued and rejected are not runs
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert 'data-n="5"' in svg and "l5,9h-10z" in svg  # the outlier is a clipped triangle
    # its own run's value and n (measured), its difference from the run it was compared
    # with ± se (inferred), each labelled
    assert "val_bpb 0.900000 (measured on 1 run) · Δ -0.100000 ± 0.02 vs its incumbent runs " \
        "(inferred)" in svg
    assert "No finished runs" in str(progress_svg([], "val_bpb"))


def test_runs_off_the_axis_sit_on_its_edge_marked() -> None:
    from agent.analysis.evidence import ExperimentEvidence, SweepEvidence

    exps = [_exp(1, "kept", 1.0, None), _exp(2, "discarded", 1.1, 1.0),
            _exp(3, "discarded", 1.05, 1.0)]
    runs = {1: (1.0, 1.01), 2: (1.1, -40.0), 3: (1.05, 60.0)}  # a wild run each way
    evidence = SweepEvidence(None, 0, None, None, None, 0, 0, {
        i: ExperimentEvidence(len(v), sum(v) / len(v), None, None, None, v)
        for i, v in runs.items()})
    svg = str(progress_svg(exps, "val_bpb", evidence=evidence))
    clipped = re.findall(r'<path class="run clipped" data-id="(\d)" d="M[\d.]+,([\d.]+)l3,'
                         r'(-?)5h-6z"><title>run: (\S+) \(off the axis\)', svg)
    assert sorted((i, sign, v) for i, _, sign, v in clipped) == [
        ("2", "-", "-40.000000"), ("3", "", "60.000000")], clipped
    ys = [float(c[1]) for c in sorted(clipped)]
    dots = [float(y) for y in re.findall(r'<circle class="run" [^>]*cy="([\d.]+)"', svg)]
    assert len(dots) == 4 and ys[0] >= max(dots) and ys[1] <= min(dots)  # on the edges


def test_the_y_axis_spans_the_runs_and_leaves_out_only_far_outliers() -> None:
    """Runs spread around their means are drawn at their value (the axis spans them); a run
    past Tukey's far-out fences is an edge triangle; a kept mean is always on the axis."""
    from agent.analysis.evidence import ExperimentEvidence, SweepEvidence
    from api.dashboard.plot import y_range

    means = [1.0, 1.02, 0.98, 1.01]
    runs = [0.9, 1.1, 0.92, 1.12, 0.88, 1.08, 0.95, 1.07]  # ±0.1 around the means
    lo, hi = y_range([*means, *runs], [1.0])
    assert lo < 0.88 and hi > 1.12
    lo, hi = y_range([*means, *runs, 40.0, -30.0], [1.0])  # crash-level values: left out
    assert 0.8 < lo < 0.88 and 1.12 < hi < 1.2
    assert y_range([1.0, 1.0, 1.0, 1.0, 5.0], [])[1] > 5.0  # no spread to judge by: spanned
    assert y_range([*means, *runs, 40.0], [40.0])[1] > 40.0  # a kept mean stays on the axis

    exps = [_exp(1, "kept", 1.0, None), _exp(2, "discarded", 1.02, 1.0),
            _exp(3, "discarded", 0.98, 1.0), _exp(4, "discarded", -30.0, 1.0)]
    values = {1: (0.9, 1.1, 1.0), 2: (0.92, 1.12), 3: (0.88, 1.08), 4: (-30.0,)}
    evidence = SweepEvidence(None, 0, None, None, None, 0, 0, {
        i: ExperimentEvidence(len(v), sum(v) / len(v), None, None, None, v)
        for i, v in values.items()})
    svg = str(progress_svg(exps, "val_bpb", evidence=evidence))
    assert svg.count('<circle class="run"') == 7  # every ordinary run at its value
    assert re.findall(r'class="run clipped" data-id="(\d)"', svg) == ["4"]
    # the far mean is a triangle on the bottom edge, pointing out
    assert re.search(r'data-id="4" data-n="4"><title>[^<]*</title><path d="M[\d.]+,[\d.]+'
                     r'l5,-9h-10z"/>', svg)


def test_loss_svg() -> None:
    assert "<polyline" in str(loss_svg([(1, 5.0), (2, 2.5), (3, float("nan"))]))
    assert "No loss points" in str(loss_svg([(1, 5.0)]))


def test_nice_ticks() -> None:
    from api.dashboard.plot import nice_ticks

    assert [t for _, t in nice_ticks(1.088, 1.312)] == ["1.10", "1.15", "1.20", "1.25", "1.30"]
    assert [t for _, t in nice_ticks(0.99, 1.0)][:2] == ["0.9900", "0.9925"]
    assert len(nice_ticks(1.0, 1.0)) == 1


def test_missing_chromium_fails_under_ci_and_skips_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    import browser_helpers

    monkeypatch.setattr(browser_helpers, "CHROMIUM", Path("/nonexistent/chromium"))
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y chromium"):
        browser_helpers.require_chromium()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        browser_helpers.require_chromium()
