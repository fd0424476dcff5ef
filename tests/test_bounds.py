"""What a keep weighs besides the metric (docs/keep-rule.md#constraints-and-simplicity):
`[target.constraints]` bounds, hard (discarded past them, with the bound as the reason) and soft
(a larger gain asked for a larger cost), and the simplicity margin, a non-inferiority test for
a change that removes lines. The pure rule, its config, and its record."""

from __future__ import annotations

import pytest

from agent.core.bounds import Bound, BoundCheck, check, parse_bound
from agent.core.config import TargetConfig
from agent.core.domain import Direction
from agent.core.domain import ExperimentStatus as S
from agent.core.record import Ending, VerdictRecord
from agent.rules.decide import Evidence, Rule, Sample, decide

BASE = tuple(Sample(m, run_id=i + 1, values=(("mem", 1000.0), ("tps", 100.0)))
             for i, m in enumerate((1.0, 1.1, 0.9, 1.05, 0.95)))  # mean 1.0, σ̂ 0.079


def runs(*metrics: float, mem: float | None = 1000.0, tps: float = 100.0) -> tuple:
    values = ((("mem", mem),) if mem is not None else ()) + (("tps", tps),)
    return tuple(Sample(m, run_id=10 + i, seed=42 + i, values=values)
                 for i, m in enumerate(metrics))


def rule(*texts: str, **kw) -> Rule:
    bounds = tuple(parse_bound(t.split(" ", 1)[0], t.split(" ", 1)[1]) for t in texts)
    return Rule(constraints=bounds, **kw)


# --- reading bounds ----------------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    ("<= 70000", Bound("k", True, 70000.0)),
    (">= 0.9 x incumbent", Bound("k", False, 0.9, True)),
    (">=0.9*incumbent", Bound("k", False, 0.9, True)),
    ("<= 1 × incumbent, soft 0.005 per 10 %", Bound("k", True, 1.0, True, 0.005, 0.1)),
    ("<= 8e4, soft 0.01 per 25%", Bound("k", True, 80000.0, False, 0.01, 0.25)),
])
def test_a_bound_reads_as_written(text, want):
    got = parse_bound("k", text)
    assert got == want
    assert parse_bound("k", got.text) == got  # its text reads back the same


@pytest.mark.parametrize("text, says", [
    ("< 5", "is not a bound"), ("<= lots", "is not a bound"), ("<= 0.9 x best", "is not a bound"),
    ("<= 0 x incumbent", "must be positive"), ("<= 5, soft 0 per 10 %", "must be positive"),
    ("<= 5, soft 0.1", "is not a bound"),
])
def test_a_bound_that_does_not_read_is_refused_by_name(text, says):
    with pytest.raises(ValueError, match=says) as err:
        parse_bound("peak_memory_mb", text)
    assert "peak_memory_mb" in str(err.value)


def test_the_config_reads_the_table_and_refuses_the_metric_and_bad_keys():
    base = dict(command="python train.py", metric="val", editable=["train.py"])
    c = TargetConfig(**base, constraints={"mem": ["<= 80000", "<= 1 x incumbent, soft 0.01 per "
                                                  "10 %"], "tps": ">= 0.9 x incumbent"},
                     simplicity_margin=0.01)
    assert [b.key for b in c.constraints] == ["mem", "mem", "tps"]
    assert c.model_dump()["constraints"] == {
        "mem": ["<= 80000", "<= 1 x incumbent, soft 0.01 per 10 %"], "tps": ">= 0.9 x incumbent"}
    assert TargetConfig(**base, **c.model_dump(include={"constraints"})).constraints == \
        c.constraints
    for bad, says in [({"val": "<= 1"}, "val is the metric"), ({"a b": "<= 1"}, "not a "
                      "summary-block key"), ({"m": 3}, "write a bound"), ("<= 3", "a table")]:
        with pytest.raises(ValueError, match=says):
            TargetConfig(**base, constraints=bad)
    with pytest.raises(ValueError, match="simplicity_margin"):
        TargetConfig(**base, simplicity_margin=-0.1)


def test_a_check_reads_means_and_how_far_past():
    b = parse_bound("mem", "<= 1 x incumbent, soft 0.005 per 10 %")
    c = check(b, [1200.0, 1400.0], [1000.0, 1000.0])
    assert (c.value, c.n, c.limit, c.incumbent_n) == (1300.0, 2, 1000.0, 2)
    assert c.past == pytest.approx(0.3) and c.cost == pytest.approx(0.015)
    assert not c.broken  # soft
    assert BoundCheck.of(c.to_json()) == c
    hard = check(parse_bound("tps", ">= 0.9 x incumbent"), [85.0], [100.0])
    assert hard.broken and "6 % under its bound 90 (>= 0.9 x incumbent)" in hard.text()
    assert not check(parse_bound("tps", ">= 0.9 x incumbent"), [95.0], [100.0]).broken


# --- hard bounds -------------------------------------------------------------------------------

def test_a_change_past_a_hard_bound_is_discarded_with_the_bound_whatever_its_gain():
    v = decide(Evidence(False, runs(0.3, mem=90000.0), BASE), rule("mem <= 70000"))
    assert v.status is S.DISCARDED and v.ending is Ending.OVER_BOUND
    assert v.reason == "over a bound: mem 90000 (mean of 1 run) is 29 % over its bound <= 70000"
    assert v.p_value is None  # no test enters the night's ledger
    rec = VerdictRecord.of({"verdict": v.record().to_json()})
    assert rec is not None and rec.ending is Ending.OVER_BOUND and rec.bounds[0].broken
    # within it, the same runs are judged on their metric
    within = decide(Evidence(False, runs(0.3, mem=60000.0), BASE), rule("mem <= 70000"))
    assert within.status is None and within.seed == 43


def test_a_relative_hard_bound_is_against_the_incumbent_runs_it_was_compared_with():
    r = rule("tps >= 0.9 x incumbent", direction=Direction.MINIMIZE)
    assert decide(Evidence(False, runs(0.3, tps=80.0), BASE), r).ending is Ending.OVER_BOUND
    assert decide(Evidence(False, runs(0.3, tps=95.0), BASE), r).status is None


def test_a_change_that_stops_reporting_a_bounded_key_is_not_let_past_it():
    v = decide(Evidence(False, runs(0.3, mem=None), BASE), rule("mem <= 70000"))
    assert v.ending is Ending.OVER_BOUND and "was not reported by its runs" in v.reason
    # a key the incumbent never reported either bounds nothing
    bare = tuple(Sample(b.metric, run_id=b.run_id) for b in BASE)
    assert decide(Evidence(False, runs(0.3, mem=None), bare),
                  rule("mem <= 1 x incumbent")).status is None


def test_the_strict_rule_keeps_its_bounds_too():
    r = rule("mem <= 70000", decision="strict")
    assert decide(Evidence(False, runs(0.3, mem=90000.0), BASE), r).ending is Ending.OVER_BOUND
    assert decide(Evidence(False, runs(0.3), BASE), r).status is S.KEPT


# --- soft bounds -------------------------------------------------------------------------------

def test_a_soft_bound_asks_more_gain_for_more_cost():
    soft = rule("mem <= 1 x incumbent, soft 0.2 per 10 %")
    # 0.695 better on two runs: kept at the incumbent's memory
    free = decide(Evidence(False, runs(0.3, 0.31), BASE), soft)
    assert free.status is S.KEPT and free.margin is None
    # the same gain 50 % over: it must exceed 1.0, and does not
    costly = decide(Evidence(False, runs(0.3, 0.31, mem=1500.0), BASE), soft)
    assert costly.status is S.DISCARDED and costly.ending is Ending.NOT_BETTER
    assert costly.margin == pytest.approx(1.0)
    assert costly.reason.endswith(
        "t -5.15, p 1, level 0.013; mem 1500 (mean of 2 runs) is 50 % over its bound 1000 (<= 1 "
        "x incumbent, soft 0.2 per 10 %): it asks 1.000000 more gain; so the gain must exceed "
        "1.000000")
    # a gain that pays for it is kept, the cost in its record
    paid = decide(Evidence(False, runs(-1.0, -0.99, mem=1500.0), BASE), soft)
    assert paid.status is S.KEPT and paid.record().bounds[0].cost == pytest.approx(1.0)


# --- simplicity --------------------------------------------------------------------------------

SIMPLE = Rule(simplicity_margin=0.3)  # about 4 σ̂: an equal change's 4 runs clear it


def test_a_simplification_no_worse_than_the_margin_is_kept_where_a_change_that_adds_is_not():
    equal = (1.0, 1.02, 0.98, 1.0)
    v = decide(Evidence(False, runs(*equal), BASE, lines=-12), SIMPLE)
    assert v.status is S.KEPT and v.ending is Ending.KEPT
    assert v.margin == pytest.approx(-0.3) and v.lines == -12 and v.record().simpler
    assert v.reason.startswith("not worse: mean 1.000000 of 4 runs: ")
    assert v.reason.endswith("; a simplification (12 lines fewer): kept unless worse by more "
                             "than 0.300000")
    # the same runs from a change that adds code, or with no margin: discarded
    for evidence, r in [(Evidence(False, runs(*equal), BASE, lines=3), SIMPLE),
                        (Evidence(False, runs(*equal), BASE, lines=-12), Rule())]:
        assert decide(evidence, r).status is S.DISCARDED


def test_a_simplification_clearly_worse_than_the_margin_is_discarded():
    v = decide(Evidence(False, runs(1.6), BASE, lines=-40), SIMPLE)
    assert v.status is S.DISCARDED and v.ending is Ending.NOT_BETTER


def test_without_measured_noise_a_simplification_is_judged_on_the_margin_too():
    same = (Sample(1.0, run_id=1), Sample(1.0, run_id=2))
    r = Rule(simplicity_margin=0.1, baseline_runs=2)
    assert decide(Evidence(False, (Sample(1.05, run_id=3),), same, lines=-5), r).status is S.KEPT
    assert decide(Evidence(False, (Sample(1.15, run_id=3),), same, lines=-5),
                  r).status is S.DISCARDED


def test_the_baseline_warns_of_a_bound_it_cannot_check_or_is_already_past():
    from agent.rules.contract import baseline_warnings

    base = tuple(Sample(m, run_id=i + 1, seed=42 + i, values=(("mem", 90000.0),))
                 for i, m in enumerate((1.0, 1.1)))
    said = baseline_warnings(base, "val", (parse_bound("mem", "<= 70000"),
                                           parse_bound("tps", ">= 0.9 x incumbent")))
    assert any("bounds tps, which the baseline's runs do not print" in w for w in said)
    assert any("the baseline's mem (mean 90000) is already past its bound <= 70000" in w
               for w in said)
    assert not any("mem" in w for w in baseline_warnings(base, "val", (
        parse_bound("mem", "<= 1 x incumbent"),)))


def test_the_language_models_prompt_says_what_is_weighed_besides_the_metric():
    from agent.core.domain import Sweep, SweepStatus, utcnow
    from agent.core.ports import ProposalContext
    from agent.proposers.llm import propose_prompt

    config = TargetConfig(command="python train.py", metric="val", editable=["train.py"],
                          simplicity_margin=0.01,
                          constraints={"peak_memory_mb": "<= 1.2 x incumbent"})
    sweep = Sweep(1, "s", "/t", "overnight/s", SweepStatus.RUNNING, "llm", config, None, 1.0,
                  1.0, None, None, utcnow())
    prompt = str(propose_prompt(ProposalContext(sweep, {"train.py": "X = 1\n"}, []), 2000))
    assert "a change that removes lines is kept unless worse by more than 0.01" in prompt
    assert "peak_memory_mb <= 1.2 x incumbent." in prompt
    plain = Sweep(1, "s", "/t", "overnight/s", SweepStatus.RUNNING, "llm", TargetConfig(
        command="python train.py", metric="val", editable=["train.py"]), None, 1.0, 1.0, None,
        None, utcnow())
    assert "Simpler is better" not in str(
        propose_prompt(ProposalContext(plain, {"train.py": "X = 1\n"}, []), 2000))
