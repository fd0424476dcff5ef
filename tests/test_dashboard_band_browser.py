"""The stop marker in a real browser: a night of the curve fake target through the real engine
with `prune = "auto"`; the pruned experiment's page in Chromium marks the check that stopped the
run (on that check's line, at the loss the rule read there) and the checks before it."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_helpers import CHROMIUM_ARGS, SCREENSHOTS, make_app, require_chromium, serve
from test_early_stop import night

from agent.core.domain import RunRole, RunStatus
from agent.engine.early_stop import on_steps, step_at, steps_per_budget
from agent.rules.prune import PrunePolicy, matched

# far behind at every check, whatever the timing of its lines (A_SHIFT 0.3 sits near the
# margin of a single 50 % check on 3 curves)
LOSING = ("A_SHIFT", "1.0", "a much worse loss everywhere")

pytestmark = pytest.mark.browser


def test_the_marker_sits_on_the_check_that_stopped_the_run(tmp_path: Path) -> None:
    chromium = require_chromium()
    runtime, sweep, ids = night(tmp_path, "auto", 1, [LOSING])
    (run,) = runtime.store.list_runs(experiment_id=ids[LOSING[2]])
    assert run.status is RunStatus.PRUNED and run.curve is not None
    stop = run.stop_fraction
    assert stop in PrunePolicy().checks
    from playwright.sync_api import sync_playwright

    with serve(make_app(tmp_path / "o.db")) as base, sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            page = b.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{base}/ui/experiments/{ids[LOSING[2]]}")
            svg = page.locator("svg.loss.band")
            mark = svg.locator("g.stopped circle")
            assert mark.count() == 1 and mark.is_visible()
            got = {k: mark.get_attribute(k) for k in ("cx", "cy", "data-fraction", "data-loss")}
            grid = [float(g.get_attribute("x1") or "nan") for g in svg.locator("line.grid").all()]
            dots = [d.get_attribute("data-fraction") for d in svg.locator("circle.check").all()]
            end_x = svg.locator("polyline.curve").evaluate(
                "el => el.points.getItem(el.points.numberOfItems - 1).x")
            box = mark.bounding_box()
            frame = svg.bounding_box()
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            svg.screenshot(path=str(SCREENSHOTS / "experiment-pruned-band.png"))
        finally:
            b.close()
    checks = PrunePolicy().checks
    assert float(got["data-fraction"] or "nan") == stop
    assert float(got["cx"] or "nan") == grid[checks.index(stop)]  # on its check's line
    assert float(got["cx"] or "nan") <= end_x  # not where the process ended
    base = [r.curve for r in runtime.store.list_runs(sweep_id=sweep.id)
            if r.role is RunRole.BASELINE and r.status is RunStatus.OK and r.curve]
    step = step_at(run.curve, stop)  # every curve read at the run's own steps, as the rule did
    per = steps_per_budget(stop, step) if step is not None else None
    v = matched(on_steps(run.curve, per), [on_steps(c, per) for c in base],
                PrunePolicy().part(checks.index(stop))).loss
    assert v is not None and f"loss {v:.2f} over" in (run.note or "")  # the rule's reading
    assert v is not None and float(got["data-loss"] or "nan") == pytest.approx(v, rel=1e-5)
    assert dots == [f"{f:g}" for f in checks if f < stop]  # each check made before it
    assert box is not None and frame is not None
    assert frame["x"] <= box["x"] and box["x"] + box["width"] <= frame["x"] + frame["width"]
