"""The dashboard in a real browser: Debian's Chromium driven by Playwright against uvicorn.

The database is filled through the real loop on the fake trainer (kept, discarded, crashed and
timed-out runs); a slow run is then executed by the loop in a thread while the sweep page is
open, and the live log tail must grow. Screenshots land in artifacts/screenshots/.
"""

from __future__ import annotations

import re
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from browser_helpers import (
    CHROMIUM_ARGS,
    RELEASE_ENV,
    SCREENSHOTS,
    Filled,
    fill_direct,
    fill_sweep,
    make_app,
    require_chromium,
    serve,
    stamp_hourly,
)

from agent.core.domain import ExperimentStatus, RunRole, RunStatus, utcnow

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Filled:
    # seed noise: σ̂ is measured and keeps rest on runs, so a change's page has a band to show
    return fill_sweep(tmp_path_factory.mktemp("dash-browser"), noise=0.01)


@pytest.fixture(scope="module")
def browser():
    chromium = require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        yield b
        b.close()


def _shot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def test_overview_sweep_and_experiment_pages(filled: Filled, browser) -> None:
    from playwright.sync_api import expect

    print(f"screenshots folder: {SCREENSHOTS}")
    with serve(make_app(filled.db)) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(base + "/")
        row = page.locator("#sweeps tbody tr", has_text="night")
        expect(row).to_have_count(1)
        expect(row).to_contain_text("done")
        # Keyboard first: the skip link is the first tab stop and shows a focus ring.
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.className") == "skip"
        _shot(page, "overview")

        row.get_by_role("link", name="night").click()
        page.wait_for_url(re.compile(r"/ui/sweeps/night$"))
        plot = page.locator("svg.progress")
        for status in ("kept", "discarded", "crashed", "timeout"):
            assert plot.locator(f"a.pt.{status}").count() >= 1, status
        # Hover a kept point: the tooltip shows its description, its measured value and its
        # inferred difference, each labelled.
        kept = plot.locator("a.pt.kept").nth(1)
        kept.hover()
        tip = page.locator("#tip")
        expect(tip).to_be_visible()
        expect(tip).to_contain_text("(measured")
        expect(tip).to_contain_text("Δ -")
        expect(tip).to_contain_text("vs its incumbent runs (inferred)")
        _shot(page, "sweep")

        # Click a discarded point: it opens that experiment's diff.
        point = plot.locator("a.pt.discarded").first
        exp_id = point.get_attribute("data-id")
        point.click()
        page.wait_for_url(re.compile(rf"/ui/experiments/{exp_id}#diff$"))
        expect(page.locator(".diff tr.d-add")).not_to_have_count(0)
        expect(page.locator(".diff tr.d-del")).not_to_have_count(0)
        expect(page.locator("#ref")).to_have_text(f"refs/overnight/night/{exp_id}")
        expect(page.locator("svg.loss:not(.band)")).to_be_visible()  # its loss by step
        # ... and its curve over the incumbent's band (the early stop's picture)
        expect(page.locator("svg.loss.band")).to_be_visible()
        _shot(page, "experiment")

        # A table row: the crashed experiment shows its crash class and the log tail.
        page.goto(base + "/ui/sweeps/night?status=crashed")
        rows = page.locator("#experiments tbody tr")
        expect(rows).to_have_count(2)  # one crashed, one timeout
        rows.filter(has_text="huge activation").get_by_role("link").first.click()
        expect(page.locator("h1")).to_contain_text("allocate a huge activation cache")
        expect(page.locator(".facts")).to_contain_text("fundamental")
        expect(page.locator("pre.log")).to_contain_text("MemoryError")
        expect(page.locator(".diff tr.d-add")).to_contain_text("raise MemoryError")
        _shot(page, "experiment-crashed")

        # The kept stack expands to a diff; the best file has a download link.
        page.goto(base + "/ui/sweeps/night")
        first = page.locator("ol.stack details").nth(1)
        first.locator("summary").click()
        expect(first.locator(".diff")).to_be_visible()
        href = page.get_by_role("link", name="download").first.get_attribute("href")
        assert href == "/ui/sweeps/night/best/train.py"
        page.close()


def test_a_page_without_the_token_is_the_login_form_and_returns_to_it(filled: Filled,
                                                                      browser) -> None:
    """Reads need the token on loopback too: the page is the login form (401), which says how
    to get the token; a wrong one is refused in place, the right one opens the page asked for
    and the cookie opens the others."""
    from playwright.sync_api import expect
    from service_fixtures import TOKEN

    with serve(make_app(filled.db, token=TOKEN)) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        answer = page.goto(base + "/ui/sweeps/night?status=kept")
        assert answer is not None and answer.status == 401
        expect(page.locator("h1")).to_have_text("Access token")
        expect(page.locator("main")).to_contain_text("overnight token")
        expect(page.locator("svg.progress")).to_have_count(0)
        page.fill("#token", "not-the-token-0123456789")
        page.click("button[type=submit]")
        expect(page.get_by_role("alert")).to_contain_text("not this server's")
        _shot(page, "login")
        page.fill("#token", TOKEN)
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r"/ui/sweeps/night\?status=kept$"))
        expect(page.locator("svg.progress")).to_be_visible()
        answer = page.goto(base + "/")
        assert answer is not None and answer.status == 200
        expect(page.locator("#sweeps tbody tr", has_text="night")).to_have_count(1)
        page.close()


def test_time_filter_links_form_and_pager(tmp_path: Path, browser) -> None:
    """Click "last 24 h", then a status: the window stays; type a since time in the form and
    page back: every page keeps it."""
    from playwright.sync_api import expect

    name = fill_direct(tmp_path, 107, name="big")
    ids = stamp_hourly(tmp_path / "big.db")  # newest first, one an hour
    since = (utcnow() - timedelta(hours=70)).strftime("%Y-%m-%dT%H:%M")
    with serve(make_app(tmp_path / "big.db")) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{base}/ui/sweeps/{name}")
        rows = page.locator("#experiments tbody tr")
        expect(rows).to_have_count(50)
        page.locator("#time-filter").get_by_role("link", name="last 24 h").click()
        page.wait_for_url(re.compile(r"since=24h"))
        expect(rows).to_have_count(24)
        page.get_by_role("navigation", name="filter by status").get_by_role(
            "link", name="discarded").click()
        page.wait_for_url(re.compile(r"status=discarded&since=24h"))
        shown = rows.count()
        assert 0 < shown < 24 and all(  # most runs are discards, not all
            rows.nth(i).locator(".badge").inner_text() == "discarded" for i in range(shown))
        page.goto(f"{base}/ui/sweeps/{name}")
        page.get_by_label("created since").fill(since)
        page.get_by_role("button", name="show").click()
        page.wait_for_url(re.compile(r"since=\d{4}-"))
        expect(rows).to_have_count(50)
        first = [int(rows.nth(i).locator("td").first.inner_text()) for i in range(50)]
        page.get_by_role("link", name="older →").click()
        page.wait_for_url(re.compile(r"before=\d+"))
        assert "since=" in page.url
        expect(rows).to_have_count(20)
        rest = [int(rows.nth(i).locator("td").first.inner_text()) for i in range(20)]
        assert first + rest == ids[:70]
        _shot(page, "sweep-time-filter")
        page.close()


def test_live_log_updates_while_a_run_is_in_flight(filled: Filled, browser) -> None:
    from playwright.sync_api import expect

    with serve(make_app(filled.db)) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(base + "/ui/sweeps/night")
        expect(page.locator("#live-body")).to_contain_text("Nothing running")

        exp, release = filled.queue_live(step_s=0.25)
        loop = filled.loop(env={RELEASE_ENV: str(release)})
        worker = threading.Thread(
            target=loop.execute, args=(filled.live_sweep(), exp), daemon=True
        )
        worker.start()
        try:
            log = page.locator(f'#live-body article[data-exp="{exp.id}"] .live-log')
            expect(log).to_contain_text("step 1 ", timeout=60_000)
            first = log.inner_text()
            expect(page.locator("#live-body .live-desc")).to_have_text(
                "slow run for the live panel"
            )
            # The tail grows while the page stays open (the JS polls every second).
            page.wait_for_function(
                "([sel, n]) => { const e = document.querySelector(sel);"
                " return e && e.textContent.length > n; }",
                arg=[f'#live-body article[data-exp="{exp.id}"] .live-log', len(first)],
                timeout=60_000,
            )
            assert page.locator(f'#live-body article[data-exp="{exp.id}"] svg.loss').count() == 1
            _shot(page, "sweep-live")
            # The experiment page of the running experiment follows it too.
            page2 = browser.new_page(viewport={"width": 1280, "height": 900})
            page2.goto(f"{base}/ui/experiments/{exp.id}")
            expect(page2.locator("#live .live-log")).to_contain_text("step", timeout=60_000)
            assert filled.store.get_experiment(exp.id).status is ExperimentStatus.RUNNING
            release.touch()  # only now may the run end
            expect(page2.locator("#live-note")).to_contain_text("finished", timeout=60_000)
            page2.close()
        finally:
            release.touch()
            worker.join(120)
        assert not worker.is_alive()
        expect(page.locator("#live-note")).to_contain_text(f"#{exp.id} finished", timeout=60_000)
        done = filled.store.get_experiment(exp.id)
        # it ended because it was released, not killed: a normal run with its summary
        assert done.status is ExperimentStatus.DISCARDED, (done.status, done.reason)
        assert "val_bpb" in (done.log_tail or "") and done.metric is not None
        page.close()


class _Changes:
    """Two changes on the seeded-noise fake trainer: a real gain (LR) and a loss (WIDTH)."""

    name = "changes"
    out_of_ideas: str | None = None

    def __init__(self) -> None:
        self.todo = [("lr 0.04", "LR = 0.01", "LR = 0.04"), ("width 32", "WIDTH = 64",
                                                               "WIDTH = 32")]

    def propose(self, ctx):  # type: ignore[no-untyped-def]
        from agent.core.domain import Proposal
        from agent.proposers.knobs import make_diff

        if not self.todo:
            return None
        desc, old, new = self.todo.pop(0)
        text = ctx.files["train.py"]
        return Proposal(desc, make_diff("train.py", text, text.replace(old, new, 1)), self.name)

    def repair(self, ctx, failed):  # type: ignore[no-untyped-def]
        return None


def test_progress_plot_shows_every_run_and_the_best_with_its_band(tmp_path, browser) -> None:
    """Seeded noise (σ̂ from three baseline runs): every run is a dot, the kept mean carries
    its 95 % band, and the header states σ̂ and how many keeps the noise supports."""
    from conftest import make_target as make_git_target
    from foreground import run_sweep
    from playwright.sync_api import expect

    from agent.core.config import load_config
    from agent.core.domain import RunRole, RunStatus
    from agent.engine.loop import Loop, LoopSettings
    from agent.executors.local import SubprocessRunner
    from agent.git.repo import GitRepo
    from agent.ops.sweeps import create_sweep
    from db.engine import open_database
    from db.store import SqlStore

    fixture = Path(__file__).parent / "fixtures" / "fake_target"
    train = (fixture / "train.py").read_text().replace("NOISE = 0.0", "NOISE = 0.1")
    # seed noise now: σ̂ measured from the runs
    toml = (fixture / "overnight.toml").read_text() + \
        "incumbent_every = 1\n"  # the best re-run after each proposal
    target = make_git_target(tmp_path / "t", edits={"train.py": train, "overnight.toml": toml})
    db = tmp_path / "o.db"
    store = SqlStore(open_database(db))
    create_sweep(store, GitRepo(target), target, name="noisy", config=load_config(target))
    loop = Loop(store, GitRepo(target), SubprocessRunner(grace_s=0.5),
                LoopSettings(tmp_path / "w"), proposer=_Changes())  # type: ignore[arg-type]
    run_sweep(loop, "noisy")
    sweep = store.get_sweep("noisy")
    runs = [r for r in store.list_runs(sweep_id=sweep.id) if r.status is RunStatus.OK]
    kept = [e for e in store.list_experiments(sweep.id) if e.description == "lr 0.04"][0]
    assert kept.status.value == "kept"

    with serve(make_app(db)) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(base + "/ui/sweeps/noisy")
        plot = page.locator("svg.progress")
        # a dot per run of each experiment, each at its value: the y-axis spans the runs (none
        # is far enough out to be an edge triangle); the incumbent's re-runs (after each
        # proposal here) count in its mean and band, not as dots of their own
        own = [r for r in runs if r.role is not RunRole.INCUMBENT]
        assert len(own) < len(runs)
        expect(plot.locator("circle.run")).to_have_count(len(own))
        expect(plot.locator(".run.clipped")).to_have_count(0)
        mine = [r for r in own if r.experiment_id == kept.id]
        expect(plot.locator(f"circle.run[data-id='{kept.id}']")).to_have_count(len(mine))
        band = plot.locator(f"rect.best-band[data-id='{kept.id}']")
        expect(band).to_have_count(1)
        assert float(band.get_attribute("height") or 0) > 1.0
        from agent.analysis.evidence import sweep_evidence

        ev = sweep_evidence(sweep, store.list_experiments(sweep.id), store.list_runs(
            sweep_id=sweep.id))
        assert ev.sigma is not None and 0.05 < ev.sigma < 0.2  # the fixture's noise, 0.1
        expect(page.locator("#sigma")).to_contain_text(f"{ev.sigma:.3g} ({ev.df} df)")
        expect(page.locator("#statement")).to_contain_text("1 change kept by the test")
        row = page.locator("#experiments tbody tr", has_text="lr 0.04")
        expect(row).to_contain_text("± 0.")
        _shot(page, "sweep-evidence")

        page.goto(base + f"/ui/experiments/{kept.id}")
        # its own runs, the incumbent's re-runs recorded under it (after each proposal) and the
        # incumbent runs it was compared with (its record names them)
        record = kept.record
        assert record is not None and record.incumbent is not None
        theirs = {r.id for r in runs if r.experiment_id == kept.id
                  and r.role is RunRole.INCUMBENT} | set(record.incumbent.runs)
        expect(page.locator("#runs tbody tr")).to_have_count(len(mine) + len(theirs))
        expect(page.locator("#runs tbody tr", has_text="compared with")).to_have_count(
            record.incumbent.n)
        # its value and the runs it is the mean of, as its record says, and its value now
        n = record.n
        expect(page.locator("#value")).to_contain_text(f"(the mean of {n} runs: " + ", ".join(
            str(i) for i in record.change.runs))
        if theirs:
            words = ev.experiments[kept.id].remeasured_text(kept.metric)
            assert words.startswith(f"kept at {kept.metric:.6f} on {n} runs; now ")
            expect(page.locator("#now")).to_have_text(words)
        page.close()


def test_the_progress_plot_marks_load_shifts(tmp_path, browser) -> None:
    """A sweep on a machine whose speed switches (tests/load_world.py): the plot's amber
    stripes sit over the runs compared beside the incumbent in other conditions, their tooltip
    says so, the header says the load was checked, and a change's page lists the incumbent run
    beside it with the keep rule's note."""
    from load_world import load_night
    from playwright.sync_api import expect

    store, sweep_id, db = load_night(tmp_path)
    runs = store.list_runs(sweep_id=sweep_id)
    paired = next(r for r in runs if r.pair_run_id)
    change = next(r for r in runs if r.id == paired.pair_run_id)
    with serve(make_app(db)) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(base + "/ui/sweeps/load")
        stripes = page.locator("svg.progress rect.load")
        expect(stripes.first).to_be_visible()
        assert "load shift" in (stripes.first.locator("title").text_content() or "")
        expect(page.locator("#load")).to_contain_text("checked")
        # the header counts what the stripes mark: experiments with runs set aside in other
        # conditions or compared beside the incumbent there
        by_id = {r.id: r for r in runs}
        marked = {by_id[r.pair_run_id].experiment_id for r in runs if r.pair_run_id} | {
            r.experiment_id for r in runs
            if r.status is RunStatus.SUSPECT and r.role is not RunRole.INCUMBENT}
        expect(page.locator("#load")).to_contain_text(f"checked: {len(marked)} experiment")
        _shot(page, "sweep-load-shifts")
        page.goto(base + f"/ui/experiments/{change.experiment_id}")
        beside = [r for r in runs if r.pair_run_id == change.id]
        rows = page.locator("#runs tbody tr", has_text=f"beside run {change.id}")
        expect(rows).to_have_count(len(beside))  # each incumbent run beside it, listed
        expect(page.locator("#runs")).to_contain_text("summary: num_steps")
        # its own runs and the incumbent's beside them, and no other experiment's; each
        # throughput with its unit
        own = {r.id for r in runs if r.experiment_id == change.experiment_id}
        want = own | {r.id for r in runs if r.pair_run_id in own}
        shown = [int(t) for t in page.locator("#runs tbody tr td:first-child").all_inner_texts()]
        assert sorted(shown) == sorted(want), (shown, want)
        speeds = page.locator("#runs tbody tr td:nth-child(6)").all_inner_texts()
        assert all(s.strip() and "None" not in s for s in speeds), speeds
        # the summary and the log tail are of one run, named: the one whose log it keeps
        exp = store.get_experiment(change.experiment_id)
        (kept_log,) = [r.id for r in runs if r.experiment_id == exp.id and r.pair_run_id is None
                       and r.log_path == exp.log_path]
        expect(page.locator("#sum-h")).to_contain_text(f"of run {kept_log}")
        expect(page.locator("#log-h")).to_contain_text(f"of run {kept_log}")
        page.close()
