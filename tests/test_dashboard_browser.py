"""The dashboard in a real browser: Debian's Chromium driven by Playwright against uvicorn.

The database is filled through the real loop on the fake trainer (kept, discarded, crashed and
timed-out runs); a slow run is then executed by the loop in a thread while the sweep page is
open, and the live log tail must grow. Screenshots land in artifacts/screenshots/.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from browser_helpers import (
    CHROMIUM_ARGS,
    RELEASE_ENV,
    SCREENSHOTS,
    Filled,
    fill_sweep,
    make_app,
    require_chromium,
    serve,
)

from agent.domain import ExperimentStatus

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Filled:
    return fill_sweep(tmp_path_factory.mktemp("dash-browser"))


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
        # Hover a kept point: the tooltip shows its description and delta.
        kept = plot.locator("a.pt.kept").nth(1)
        kept.hover()
        tip = page.locator("#tip")
        expect(tip).to_be_visible()
        expect(tip).to_contain_text("delta -")
        _shot(page, "sweep")

        # Click a discarded point: it opens that experiment's diff.
        point = plot.locator("a.pt.discarded").first
        exp_id = point.get_attribute("data-id")
        point.click()
        page.wait_for_url(re.compile(rf"/ui/experiments/{exp_id}#diff$"))
        expect(page.locator(".diff tr.d-add")).not_to_have_count(0)
        expect(page.locator(".diff tr.d-del")).not_to_have_count(0)
        expect(page.locator("#ref")).to_have_text(f"refs/overnight/night/{exp_id}")
        expect(page.locator("svg.loss")).to_be_visible()
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
