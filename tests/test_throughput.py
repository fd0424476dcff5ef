"""Where a run's throughput comes from: the summary block, else its progress lines (with their
elapsed seconds, else the service's clock), else nowhere; and the repeats that cannot measure
the noise (a script that ignores OVERNIGHT_SEED)."""

from __future__ import annotations

import pytest

from agent.rules.contract import baseline_warnings, identical_repeats, load_unchecked, seed_ignored
from agent.rules.placement import Sample
from agent.rules.throughput import ProgressMeter, from_progress, speed


def meter(points: list[tuple[int, float | None, float]]) -> ProgressMeter:
    m = ProgressMeter()
    for step, elapsed, at in points:
        m.add(step, elapsed, at)
    return m


def test_summary_keys_come_first():
    lines = meter([(10, 1.0, 0.0), (110, 11.0, 10.0)])
    got = speed({"training_seconds": 10.0, "total_tokens_M": 1.0}, lines)
    assert (got.value, got.unit, got.source) == (1e5, "tokens/s", "summary: total_tokens_M")
    got = speed({"training_seconds": 10.0, "num_steps": 50}, lines)
    assert (got.value, got.source) == (5.0, "summary: num_steps")


def test_progress_lines_stand_in_for_a_summary_without_steps():
    # steps between the first and last timed line: start-up and compilation left out
    got = speed({"training_seconds": 20.0}, meter([(1, 4.0, 0.0), (201, 14.0, 10.0)]))
    assert (got.value, got.unit, got.source) == (20.0, "steps/s", "progress: elapsed")
    got = from_progress(meter([(30, 10.0, 0.0)]))  # one timed line: its step / its elapsed
    assert got.value == pytest.approx(3.0)
    # no elapsed printed: the service's clock at each line
    got = from_progress(meter([(5, None, 100.0), (45, None, 104.0)]))
    assert (got.value, got.source) == (10.0, "progress: clock")


def test_nothing_says_the_speed():
    assert speed({"training_seconds": 0.0, "num_steps": 50}).value is None
    assert speed({"val_loss": 1.0}, ProgressMeter()).source is None
    assert from_progress(meter([(5, None, 1.0)])).value is None  # one untimed line
    assert from_progress(meter([(1, None, 1.0), (3, None, 1.002)])).value is None  # a burst
    # elapsed times printed to the hundredth over milliseconds measure their rounding: 0.00 s
    # then 0.01 s is not "200 steps/s" (the fake trainer's lines, alternately timed or not)
    fast = [(1, 0.0, 5.0), (2, 0.0, 5.001), (3, 0.01, 5.002)]
    assert from_progress(meter(fast)).value is None
    assert from_progress(meter([(3, 0.01, 5.0)])).value is None
    runs = [Sample(1.0), Sample(1.1)]
    warning = load_unchecked(runs)
    assert warning and "cannot be checked" in warning and "num_steps" in warning
    assert load_unchecked([Sample(1.0, 12.0), Sample(1.1)]) is None


def test_identical_repeats_with_different_seeds_mean_the_seed_is_ignored():
    same = [Sample(1.234567, seed=42), Sample(1.234567, seed=43), Sample(1.234567, seed=44)]
    assert identical_repeats(same) == (3, 1.234567)
    warning = seed_ignored(same, "val_loss")
    assert warning and "seeds 42, 43, 44" in warning and "OVERNIGHT_SEED" in warning
    assert "torch.manual_seed(seed)" in warning
    assert seed_ignored([Sample(1.0, seed=42), Sample(1.0, seed=42)], "m") is None  # one seed
    assert seed_ignored([Sample(1.0, seed=42), Sample(1.1, seed=43)], "m") is None
    assert len(baseline_warnings(same, "val_loss")) == 2  # no speed either
