"""api.dashboard.band: the stop marker sits at the check that stopped the run (the fraction its
reason names, the loss the rule read there), and each check a judged run passed has its dot."""

from __future__ import annotations

import math
import re

from agent.core.domain import Run, RunRole, RunStatus
from agent.rules.prune import PruneCall, PrunePolicy, check
from api.dashboard.band import band_svg


def curve(offset: float, seed: int, until: float = 1.0) -> tuple[tuple[float, float, float], ...]:
    out = []
    for i in range(1, 201):
        f = i / 200
        if f > until + 1e-9:
            break
        wiggle = 0.01 * math.sin(7 * f + seed)
        out.append((f, 2.0 + 3.0 * math.exp(-5 * f) + offset + wiggle + 0.01 * seed, i * 10.0))
    return tuple(out)


def run(rid: int, points, status: RunStatus = RunStatus.OK, note: str | None = None,
        role: RunRole = RunRole.SCREEN, stop: float | None = None) -> Run:  # type: ignore[no-untyped-def]
    return Run(rid, 1, 2, "c", 42, role, status, curve=points, note=note, stop_fraction=stop)


THEIRS = [run(i, curve(0.0, i), role=RunRole.BASELINE) for i in range(3)]


def attrs(svg: str, cls: str) -> list[dict[str, float]]:
    """The numeric attributes of each circle of `cls` ("check", or the stopped group's)."""
    if cls == "stopped":
        found = re.findall(r'<g class="stopped">.*?<circle ([^>]*)/>', svg)
    else:
        found = re.findall(rf'<circle class="{cls}" ([^>]*)>', svg)
    return [{k: float(v) for k, v in re.findall(r'([\w-]+)="([-\d.e]+)"', a)} for a in found]


def grid_x(svg: str) -> list[float]:
    return [float(x) for x in re.findall(r'<line class="grid" x1="([\d.]+)"', svg)]


def test_the_stop_marker_is_at_the_check_that_stopped_the_run_not_its_end() -> None:
    # stopped at 50 %, its process ended a little later (points up to 58 %)
    loser = curve(1.0, 7, until=0.58)
    call = check([(f, v) for f, v, _ in loser], [[(f, v) for f, v, _ in c.curve or ()]
                                                  for c in THEIRS], 1, 0.001)
    assert call.stop
    svg = str(band_svg([run(9, loser, RunStatus.PRUNED, call.reason(), stop=call.fraction)],
                       THEIRS))
    (mark,) = attrs(svg, "stopped")
    assert mark["data-fraction"] == 0.5
    assert mark["data-loss"] == float(f"{call.loss:.6g}")
    xs = grid_x(svg)
    assert mark["cx"] == xs[1]  # on the 50 % check's line, left of the curve's end
    (dot,) = attrs(svg, "check")  # the 25 % check it passed, at the loss it read there
    assert dot["data-fraction"] == 0.25 and dot["cx"] == xs[0]
    passed = check([(f, v) for f, v, _ in loser], [[(f, v) for f, v, _ in c.curve or ()]
                                                    for c in THEIRS], 0, 0.001)
    assert passed.loss is not None and dot["data-loss"] == float(f"{passed.loss:.6g}")
    assert "stopped at 50 % of the budget" in svg


def test_a_run_that_went_on_has_a_dot_at_each_check_and_no_marker() -> None:
    svg = str(band_svg([run(9, curve(0.0, 5))], THEIRS))
    assert [d["data-fraction"] for d in attrs(svg, "check")] == [0.25, 0.5, 0.75]
    assert '<g class="stopped">' not in svg
    off = str(band_svg([run(9, curve(0.0, 5))], THEIRS, judged=False))
    assert attrs(off, "check") == []  # prune = "off": nothing was checked


def test_the_checks_drawn_are_the_target_policy() -> None:
    policy = PrunePolicy(looks=5)  # max_runs 5: checks at 20, 40, 60 and 80 %
    loser = curve(1.0, 7, until=0.62)
    call = PruneCall(True, 0.6, "clearly behind", 4.0, 3.0, 0.1, 0.0001)
    svg = str(band_svg([run(9, loser, RunStatus.PRUNED, call.reason(), stop=0.6)], THEIRS,
                       policy=policy))
    (mark,) = attrs(svg, "stopped")
    assert mark["data-fraction"] == 0.6 and mark["cx"] == grid_x(svg)[2]
    read = check([(f, v) for f, v, _ in loser], [[(f, v) for f, v, _ in c.curve or ()]
                                                  for c in THEIRS], 2, 0.001, policy)
    assert read.loss is not None and mark["data-loss"] == float(f"{read.loss:.6g}")
    assert [d["data-fraction"] for d in attrs(svg, "check")] == [0.2, 0.4]


def test_a_pruned_run_with_no_recorded_stop_is_marked_at_its_end() -> None:
    loser = curve(1.0, 7, until=0.42)
    svg = str(band_svg([run(9, loser, RunStatus.PRUNED, "stopped")], THEIRS))
    (mark,) = attrs(svg, "stopped")
    assert mark["data-fraction"] == loser[-1][0]


def test_the_marker_reads_the_recorded_stop_not_the_notes_words() -> None:
    # the note's sentence says 50 %; the record says 75 %: the record is what is drawn
    loser = curve(1.0, 7, until=0.8)
    note = PruneCall(True, 0.5, "clearly behind", 4.0, 3.0, 0.1, 0.0001).reason()
    svg = str(band_svg([run(9, loser, RunStatus.PRUNED, note, stop=0.75)], THEIRS))
    (mark,) = attrs(svg, "stopped")
    assert mark["data-fraction"] == 0.75 and mark["cx"] == grid_x(svg)[2]
