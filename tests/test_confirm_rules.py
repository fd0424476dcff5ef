"""Pure parts of the confirmation at scale and of the sealed holdout: `--confirm-at` parsed,
the verdict read from known runs, the holdout taken out of a summary and a log."""

from __future__ import annotations

import pytest

from agent.analysis.confirm import (
    FLIPS,
    HOLDS,
    SHRINKS,
    UNCLEAR,
    confirm,
    confirmed_sweep,
    parse_at,
)
from agent.core.config import Direction, TargetConfig
from agent.core.errors import ConfigError
from agent.rules.holdout import redact, redact_bytes, seal_summary

NIGHT = (0.05, 0.01, 1.0)  # a 5 % gain ± 1 % at night (baseline 1.0)


def runs(centre: float, spread: float = 0.002) -> list[float]:
    return [centre - spread, centre, centre + spread]


def test_parse_at():
    assert parse_at("budget=1800").budget == 1800.0
    assert parse_at(" budget = 90.5 ").text() == "budget=90.5"
    at = parse_at("device=cuda:1")
    assert at.device == "cuda:1" and at.budget is None and at.knob is None
    at = parse_at("DEPTH=8")
    assert at.knob == "DEPTH" and at.value == "8" and at.budget is None
    for bad, words in [("budget", "expected KEY=VALUE"), ("=3", "expected KEY=VALUE"),
                       ("budget=", "expected KEY=VALUE"), ("budget=soon", "2M tokens"),
                       ("budget=0", "positive number"), ("budget=inf", "positive number"),
                       ("budget=nan", "positive number"), ("device=a b", "device name"),
                       ("my-knob=3", "unknown key 'my-knob'"), ("DEPTH=deep", "a number")]:
        with pytest.raises(ConfigError, match=words):
            parse_at(bad)


def test_the_four_verdicts():
    minimize = Direction.MINIMIZE
    # The same 5 % at a scale where the baseline is 0.5: it holds.
    c = confirm("c", "budget=9", minimize, runs(0.5), runs(0.475), NIGHT, 3)
    assert c.verdict == HOLDS and c.relative == pytest.approx(0.05)
    assert c.gain == pytest.approx(0.025) and c.runs == 6 and c.baseline_n == 3
    # 1 %: still better, clearly less than the night's 5 %.
    assert confirm("c", "x", minimize, runs(0.5), runs(0.495), NIGHT).verdict == SHRINKS
    # Nothing left, and clearly less than at night: shrinks (not told from zero).
    c = confirm("c", "x", minimize, runs(0.5, 0.01), runs(0.499, 0.01), NIGHT)
    assert c.verdict == SHRINKS and "not told from zero" in c.reason
    # Clearly worse: flips.
    assert confirm("c", "x", minimize, runs(0.5), runs(0.52), NIGHT).verdict == FLIPS
    # Too noisy to say anything: unclear.
    c = confirm("c", "x", minimize, runs(0.5, 0.2), runs(0.48, 0.2), NIGHT)
    assert c.verdict == UNCLEAR and "spans zero" in c.reason
    # Not measured, or no noise to build an interval on.
    assert confirm("c", "x", minimize, [], runs(0.5), NIGHT).verdict == UNCLEAR
    assert confirm("c", "x", minimize, [0.5], [0.4], NIGHT).verdict == UNCLEAR


def test_a_maximized_metric_reads_the_other_way():
    c = confirm("c", "x", Direction.MAXIMIZE, runs(0.80), runs(0.84), (0.04, 0.01, 0.8))
    assert c.verdict == HOLDS and c.gain == pytest.approx(0.04)
    assert confirm("c", "x", Direction.MAXIMIZE, runs(0.8), runs(0.78),
                   (0.04, 0.01, 0.8)).verdict == FLIPS


def test_which_sweep_a_confirmation_confirms():
    assert confirmed_sweep("confirm:night") == "night"
    assert confirmed_sweep("ablation:night") is None and confirmed_sweep("knobs") is None


def test_holdout_metric_config():
    base = {"command": "python train.py", "editable": ["train.py"], "metric": "val_bpb",
            "budget_s": 5}
    assert TargetConfig.from_dict({**base, "holdout_metric": "holdout_bpb"}).holdout_metric \
        == "holdout_bpb"
    assert TargetConfig.from_dict(base).holdout_metric is None
    with pytest.raises(ConfigError, match="holdout_metric: must differ from metric"):
        TargetConfig.from_dict({**base, "holdout_metric": "val_bpb"})
    with pytest.raises(ConfigError, match="holdout_metric"):
        TargetConfig.from_dict({**base, "holdout_metric": "hold out"})


def test_sealing_a_summary_and_a_log():
    summary, value = seal_summary({"val_bpb": 1.2, "holdout_bpb": 1.31}, "holdout_bpb")
    assert summary == {"val_bpb": 1.2} and value == 1.31
    assert seal_summary({"holdout_bpb": "oops"}, "holdout_bpb") == ({}, None)
    assert seal_summary({"holdout_bpb": float("nan")}, "holdout_bpb") == ({}, None)
    assert seal_summary({"a": 1.0}, None) == ({"a": 1.0}, None)
    log = "step 1 | loss 2.0\n---\nval_bpb: 1.2\nholdout_bpb:      1.314159\nmy_holdout_bpb: 3\n"
    sealed = redact(log, "holdout_bpb")
    assert "1.314159" not in sealed and "holdout_bpb: sealed" in sealed
    assert "my_holdout_bpb: 3" in sealed and "val_bpb: 1.2" in sealed  # other keys stay
    assert redact_bytes(log.encode(), "holdout_bpb") == sealed.encode()
    assert redact(log, None) == log
