"""The morning report's HTML page in a real browser, offline: Debian's Chromium driven by
Playwright opens the file `overnight report --format html` wrote with every network request
refused, and the page must render whole from itself (plot, tables, stylesheet). The dashboard
links to the same page. Screenshots land in artifacts/screenshots/.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest
from browser_helpers import CHROMIUM_ARGS, SCREENSHOTS, make_app, require_chromium, serve
from report_fixtures import Night, expected, noisy_night

pytestmark = pytest.mark.browser
OVERNIGHT = Path(sys.executable).parent / "overnight"
KEPT_GREEN = (0x1A, 0x7F, 0x37)  # --kept in the dashboard's stylesheet


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> Night:
    return noisy_night(tmp_path_factory.mktemp("report-browser"))


@pytest.fixture(scope="module")
def browser():
    chromium = require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        yield b
        b.close()


def pixels(page, png: bytes) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """The screenshot decoded by the browser itself: its size, how many pixels are not white
    and how many are the kept marks' green."""
    data = "data:image/png;base64," + base64.b64encode(png).decode()
    return page.evaluate("""async (src) => {
        const img = new Image(); img.src = src; await img.decode();
        const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
        const g = c.getContext('2d'); g.drawImage(img, 0, 0);
        const d = g.getImageData(0, 0, c.width, c.height).data;
        let ink = 0, green = 0;
        for (let i = 0; i < d.length; i += 4) {
            if (d[i] < 240 || d[i + 1] < 240 || d[i + 2] < 240) ink++;
            if (Math.abs(d[i] - 26) < 12 && Math.abs(d[i + 1] - 127) < 12 &&
                Math.abs(d[i + 2] - 55) < 12) green++;
        }
        return {w: c.width, h: c.height, ink: ink, green: green};
    }""", data)


def test_the_report_renders_offline_from_itself(night: Night, browser, tmp_path: Path):
    from playwright.sync_api import expect

    out = tmp_path / "night.html"
    proc = subprocess.run([str(OVERNIGHT), "report", "--sweep", night.name, "--db",
                           str(night.db), "--format", "html", "--output", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    context = browser.new_context(viewport={"width": 1280, "height": 900}, offline=True)
    asked: list[str] = []

    def refuse(route):  # type: ignore[no-untyped-def]
        asked.append(route.request.url)
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            route.abort()

    context.route("**/*", refuse)
    page = context.new_page()
    page.goto(out.as_uri())
    assert asked == [out.as_uri()]  # the page asked for nothing but itself

    want = expected(night)
    expect(page.locator("#headline")).to_contain_text(
        f"val_bpb {want['baseline']:.6f} → {want['best']:.6f}")
    plot = page.locator("svg.progress")
    expect(plot).to_be_visible()
    for status in ("kept", "discarded", "crashed", "timeout"):
        assert plot.locator(f"a.pt.{status}").count() >= 1, status
    assert page.locator("#kept tbody tr").count() == len(want["kept"])
    # A kept mark links to its row in the page.
    first = want["kept"][0]["id"]
    assert plot.locator(f'a.pt.kept[href="#exp-{first}"]').count() == 1
    assert page.locator(f"#exp-{first}").count() == 1

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / "morning-report.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")
    whole = pixels(page, shot.read_bytes())
    assert whole["w"] == 1280 and whole["h"] > 900
    assert whole["ink"] > 0.02 * whole["w"] * whole["h"]  # not a blank page
    drawn = pixels(page, plot.screenshot())
    assert drawn["green"] > 50 and drawn["ink"] > 0.03 * drawn["w"] * drawn["h"]
    # Its styles came from the page itself: the kept marks are the stylesheet's green.
    color = page.evaluate("getComputedStyle(document.querySelector('svg a.pt.kept circle'))"
                          ".fill")
    assert color == "rgb({}, {}, {})".format(*KEPT_GREEN)
    context.close()


def test_the_dashboard_links_to_the_report(night: Night, browser):
    from playwright.sync_api import expect

    with serve(make_app(night.db)) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{base}/ui/sweeps/{night.name}")
        page.locator("#report-links").get_by_role("link", name="page").click()
        page.wait_for_url(f"{base}/ui/sweeps/{night.name}/report")
        expect(page.locator("#statement")).to_contain_text("kept by the test")
        expect(page.locator("svg.progress")).to_be_visible()
        md = page.request.get(f"{base}/ui/sweeps/{night.name}/report.md")
        assert md.ok and md.text().startswith(f"# Sweep `{night.name}`: the morning report")
        assert "text/markdown" in md.headers["content-type"]
        assert page.request.get(f"{base}/ui/sweeps/nope/report").status == 404
        page.close()
