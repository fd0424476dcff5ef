"""The learning `knobs` proposer: its steps per type, and its decisions on hand-made histories."""

import math
from dataclasses import replace

import pytest
from record_fixtures import record, recorded

from agent.analysis.trials import trials
from agent.core.config import Direction, TargetConfig
from agent.core.diff import make_diff
from agent.core.domain import CrashKind, Experiment, ExperimentStatus, Sweep, SweepStatus, utcnow
from agent.core.ports import ProposalContext
from agent.core.record import Ending
from agent.proposers.effects import NOISE_SHARE, Effect, Switch
from agent.proposers.knobs import KnobsProposer, find_knobs
from agent.proposers.search_state import null_knobs
from agent.rules.knob_space import KnobValue, moved, parse_literal

SRC = """# header
DEPTH = 4  # layers
D_MODEL = 128
LR = 3e-3
WARMUP = 0.1
USE_MUON = False
NAME = "gpt"
EVAL_EVERY = 100  # knobs: skip
def f():
    X = 1
"""
BASE = 1.0  # the baseline's metric in these histories


def sweep(**config):
    return Sweep(1, "s", "/t", "overnight/s", SweepStatus.RUNNING, "knobs",
                 TargetConfig(command="python train.py", editable=("train.py",), protected=(),
                              metric="val_bpb", budget_s=1, timeout_s=3, **config),
                 None, BASE, BASE, None, None, utcnow())


def ctx(history=(), src=SRC, **config):
    return ProposalContext(sweep(**config), {"train.py": src}, list(history))


def set_const(src: str, name: str, value: str) -> str:
    lines = src.splitlines(keepends=True)
    knob = next(k for k in find_knobs("train.py", src) if k.name == name)
    lines[knob.line_no] = lines[knob.line_no].replace(knob.raw, value, 1)
    return "".join(lines)


class History:
    """Builds a sweep history of one-constant runs with metrics (lower is better)."""

    def __init__(self, src: str = SRC) -> None:
        self.src, self.best = src, BASE
        self.exps = [Experiment(1, 1, ExperimentStatus.KEPT, "baseline", "", "baseline",
                                is_baseline=True, metric=BASE)]

    def run(self, changes: dict[str, str], status: ExperimentStatus, gain: float = 0.0,
            crash: str | None = None, se: float | None = None) -> Experiment:
        new = self.src
        for name, value in changes.items():
            new = set_const(new, name, value)
        exp = Experiment(len(self.exps) + 1, 1, status, f"set {changes}",
                         make_diff("train.py", self.src, new), "knobs", best_before=self.best,
                         metric=None if crash else self.best - gain)
        if crash:
            exp = replace(exp, crash_kind=CrashKind.FUNDAMENTAL, reason=crash, log_tail=crash)
        else:  # its record: one run against one run of the best
            ending = Ending.KEPT if status is ExperimentStatus.KEPT else Ending.NOT_BETTER
            exp = recorded(exp, record(ending, [self.best - gain], compared=[self.best], se=se))
        if status is ExperimentStatus.KEPT:
            self.src, self.best = new, self.best - gain
        self.exps.append(exp)
        return exp

    def ctx(self, **config) -> ProposalContext:
        return ProposalContext(replace(sweep(**config), best_metric=self.best),
                               {"train.py": self.src}, list(self.exps))


D, K, C = ExperimentStatus.DISCARDED, ExperimentStatus.KEPT, ExperimentStatus.CRASHED


def test_find_knobs_reads_module_constants_only():
    names = [k.name for k in find_knobs("train.py", SRC)]
    assert names == ["DEPTH", "D_MODEL", "LR", "WARMUP", "USE_MUON"]


@pytest.mark.parametrize("raw, up, down", [
    ("128", "256", "64"),  # powers of two stay powers of two
    ("200", "400", "100"),  # an integer moves by a meaningful step, never to 201
    ("3e-3", "6e-3", "1.5e-3"),  # learning rates on a log scale
    ("10000.0", "20000.0", "5000.0"),
])
def test_first_steps_are_doublings_in_the_knobs_scale(raw, up, down):
    knob = KnobValue("X", raw, parse_literal(raw))
    assert moved(knob, 1, 0.6931471805599453) == up
    assert moved(knob, -1, 0.6931471805599453) == down


def test_integers_take_rounded_half_steps_and_fractions_never_cross_their_bounds():
    assert moved(KnobValue("WIDTH", "200", 200), 1, 0.35) == "280"  # ×√2, multiple of 8
    beta = KnobValue("ADAM_BETA2", "0.95", 0.95)
    ups = [float(moved(beta, 1, s)) for s in (0.7, 1.4, 5.0, 12.0)]
    assert ups[0] == pytest.approx(0.974, abs=1e-3) and all(0.95 < v < 1 for v in ups)
    downs = [float(moved(KnobValue("WARMUP", "0.01", 0.01), -1, s)) for s in (0.7, 5.0)]
    assert all(0 < v < 0.01 for v in downs)
    assert moved(KnobValue("USE_MUON", "False", False), 1, 0.7) == "True"
    assert moved(KnobValue("USE_MUON", "False", False), -1, 0.7) is None


def test_first_proposal_on_an_integer_is_not_plus_one():
    src = "STEPS = 200\n"
    for seed in range(5):
        p = KnobsProposer(seed=seed).propose(ctx(src=src))
        assert p.meta["knob"] == "STEPS" and abs(int(p.meta["new"]) - 200) >= 16


def test_deterministic_never_repeats_and_carries_a_category():
    a = KnobsProposer(seed=7).propose(ctx())
    b = KnobsProposer(seed=7).propose(ctx())
    assert a == b and a.diff.startswith("--- a/train.py")
    h = History()
    seen = set()
    for i in range(30):
        p = KnobsProposer(seed=7).propose(h.ctx())
        assert p is not None and p.diff not in seen, f"repeat at proposal {i}"
        assert p.meta["category"] in ("hyperparameter", "architecture", "optimizer",
                                      "data/schedule", "simplification")
        seen.add(p.diff)
        changes = {c["knob"]: c["new"] for c in p.meta.get("changes", [])} or {
            p.meta["knob"]: p.meta["new"]}
        h.run(changes, D, gain=-0.001 * (i % 3))


@pytest.mark.parametrize("seed", range(5))
def test_a_big_keep_is_pushed_further_the_same_way(seed):
    h = History()
    h.run({"DEPTH": "8"}, D, gain=-0.002)
    h.run({"WARMUP": "0.2"}, D, gain=-0.001)
    h.run({"USE_MUON": "True"}, D, gain=-0.002)
    h.run({"LR": "6e-3"}, K, gain=0.05)
    p = KnobsProposer(seed=seed).propose(h.ctx())
    assert (p.meta["knob"], p.meta["direction"], p.meta["old"]) == ("LR", 1, "6e-3")
    assert float(p.meta["new"]) > 6e-3 and "-LR = 6e-3" in p.diff


@pytest.mark.parametrize("seed", range(5))
def test_crash_region_is_avoided(seed):
    h = History()
    h.run({"D_MODEL": "256"}, C, crash="out of memory")
    for _ in range(25):  # many proposals later, D_MODEL never goes to 256 or beyond
        p = KnobsProposer(seed=seed).propose(h.ctx())
        changes = {c["knob"]: c["new"] for c in p.meta.get("changes", [])} or {
            p.meta["knob"]: p.meta["new"]}
        assert float(changes.get("D_MODEL", "128")) < 256, p.description
        h.run(changes, D, gain=-0.003)
    # after a second crash that way, D_MODEL does not go up at all
    h.run({"D_MODEL": "181"}, C, crash="out of memory")
    for _ in range(10):
        p = KnobsProposer(seed=seed).propose(h.ctx())
        assert not (p.meta["knob"] == "D_MODEL" and p.meta["direction"] == 1)
        h.run({p.meta["knob"]: p.meta["new"]}, D, gain=-0.003)


@pytest.mark.parametrize("seed", range(5))
def test_a_region_past_a_hard_bound_is_avoided_as_a_crash_region_is(seed):
    """[target.constraints]: D_MODEL 256 was far better but over the memory ceiling, so it
    was discarded over a bound; the search neither goes there again nor re-tests it as a
    near-miss."""
    h = History()
    over = h.run({"D_MODEL": "256"}, D, gain=0.3)
    h.exps[-1] = recorded(over, record(Ending.OVER_BOUND, [BASE - 0.3], compared=[BASE]))
    for _ in range(25):
        p = KnobsProposer(seed=seed).propose(h.ctx())
        changes = {c["knob"]: c["new"] for c in p.meta.get("changes", [])} or {
            p.meta["knob"]: p.meta["new"]}
        assert float(changes.get("D_MODEL", "128")) < 256, p.description
        assert "near-miss" not in p.description
        h.run(changes, D, gain=-0.003)


def test_plateau_switches_to_a_knob_not_tried_lately():
    h = History()
    h.run({"LR": "6e-3"}, K, gain=0.05)
    for lr in ("1.2e-2", "4.2e-3", "8.5e-3"):
        h.run({"LR": lr}, D, gain=-0.004)
    for depth in ("8", "2", "6"):
        h.run({"DEPTH": depth}, D, gain=-0.004)
    for seed in range(5):
        p = KnobsProposer(seed=seed).propose(h.ctx())
        assert p.meta["knob"] != "DEPTH" and p.meta["plateau"].startswith("plateau")


def test_two_near_misses_are_combined_when_single_changes_stall():
    h = History()
    h.run({"WARMUP": "0.2"}, D, gain=-0.0001)  # near-miss (the noise not measured)
    h.run({"USE_MUON": "True"}, D, gain=-0.0002)  # near-miss
    h.run({"DEPTH": "8"}, D, gain=-0.01)
    h.run({"D_MODEL": "256"}, D, gain=-0.012)
    h.run({"LR": "6e-3"}, D, gain=-0.02)
    p = KnobsProposer(seed=3).propose(h.ctx())
    assert p.meta["move"] == "combine" and sorted(p.meta["combines"]) == [2, 3]
    assert "+WARMUP = 0.2" in p.diff and "+USE_MUON = True" in p.diff


def test_a_near_miss_is_retested_after_the_head_moved():
    h = History()
    h.run({"WARMUP": "0.2"}, D, gain=-0.0001)  # near-miss on the first head
    h.run({"LR": "6e-3"}, K, gain=0.05)  # the head moves
    for depth, gain in (("8", -0.008), ("2", -0.012), ("6", -0.01)):
        h.run({"DEPTH": depth}, D, gain=gain)
    p = KnobsProposer(seed=0).propose(h.ctx())
    assert p.meta["move"] == "retest" and p.meta["retest_of"] == 2
    assert p.meta["knob"] == "WARMUP" and 0.1 < float(p.meta["new"]) < 0.2


@pytest.mark.parametrize("seed", range(5))
def test_only_a_near_miss_that_saw_more_than_its_noise_is_re_tested_or_combined(seed):
    """A discard within one standard error of zero saw nothing: no lead to follow. One more
    than a standard error better than the incumbent is."""
    def stalled(warmup_gain: float, muon_gain: float) -> History:
        h = History()
        h.run({"WARMUP": "0.2"}, D, gain=warmup_gain, se=0.001)
        h.run({"USE_MUON": "True"}, D, gain=muon_gain, se=0.001)
        h.run({"LR": "6e-3"}, K, gain=0.05, se=0.001)  # the head moves
        for depth, gain in (("8", -0.008), ("2", -0.012), ("6", -0.01), ("5", -0.009),
                            ("7", -0.011)):
            h.run({"DEPTH": depth}, D, gain=gain, se=0.001)
        return h

    p = KnobsProposer(seed=seed).propose(stalled(0.0008, -0.0005).ctx())
    assert p.meta["move"] not in ("combine", "retest"), p.description
    p = KnobsProposer(seed=seed).propose(stalled(0.0015, 0.0012).ctx())
    assert p.meta["move"] == "combine" and sorted(p.meta["combines"]) == [2, 3]


@pytest.mark.parametrize("seed", range(5))
def test_a_knob_that_measured_null_both_ways_is_set_aside(seed):
    """LR a step up and a step down from its value: each within one standard error of zero.
    The search spends its next proposals on the other knobs, DEPTH among them (one of its
    runs lost four standard errors)."""
    h = History()
    h.run({"LR": "6e-3"}, D, gain=0.0004, se=0.001)
    h.run({"LR": "1.5e-3"}, D, gain=-0.0009, se=0.001)
    h.run({"DEPTH": "8"}, D, gain=-0.004, se=0.001)
    h.run({"DEPTH": "2"}, D, gain=0.0002, se=0.001)
    knobs = []
    for _ in range(6):
        p = KnobsProposer(seed=seed).propose(h.ctx())
        knobs.append(p.meta["knob"])
        h.run({p.meta["knob"]: p.meta["new"]}, D, gain=-0.003, se=0.001)
    assert "LR" not in knobs and "DEPTH" in knobs, knobs


def test_which_knobs_are_set_aside():
    """Null both ways from the present value: set aside. A run from that value that saw
    something (a loss of 3 standard errors), a move one way only, or null runs from a value
    the knob has since left: not."""
    def aside(h: History) -> set[str]:
        head = {k.name: k.raw for k in find_knobs("train.py", h.src)}
        return null_knobs(head, trials(h.exps, Direction.MINIMIZE))

    h = History()
    h.run({"LR": "6e-3"}, D, gain=0.0004, se=0.001)
    h.run({"LR": "1.5e-3"}, D, gain=-0.0009, se=0.001)
    h.run({"DEPTH": "8"}, D, gain=0.0002, se=0.001)
    assert aside(h) == {"LR"}
    h.run({"LR": "1.2e-2"}, D, gain=-0.003, se=0.001)
    assert aside(h) == set()
    h = History()
    h.run({"LR": "6e-3"}, D, gain=0.0004, se=0.001)
    h.run({"LR": "1.5e-3"}, K, gain=0.0009, se=0.001)  # kept: LR has a new value
    assert aside(h) == set()
    h = History()  # the noise not measured: null only when nothing changed at all
    h.run({"LR": "6e-3"}, D, gain=0.0, se=None)
    h.run({"LR": "1.5e-3"}, D, gain=-0.0001, se=None)
    assert aside(h) == set()
    h = History()  # a switch has one way from its value
    h.run({"USE_MUON": "True"}, D, gain=0.0003, se=0.001)
    assert aside(h) == {"USE_MUON"}


def test_a_knob_set_aside_comes_back_when_nothing_else_is_left():
    """A script with one knob, measured null both ways: the search still proposes it (closer
    and further) rather than stop."""
    h = History("LR = 3e-3\n")
    h.run({"LR": "6e-3"}, D, gain=0.0, se=0.001)
    h.run({"LR": "1.5e-3"}, D, gain=0.0, se=0.001)
    for seed in range(3):
        p = KnobsProposer(seed=seed).propose(h.ctx())
        assert p is not None and p.meta["knob"] == "LR"


def test_a_capped_category_is_left_alone():
    h = History()
    for depth in ("8", "2"):
        h.run({"DEPTH": depth}, D, gain=-0.01)
    for seed in range(5):
        p = KnobsProposer(seed=seed).propose(
            replace(h.ctx(), sweep=replace(sweep(category_shares={"architecture": 0.2}),
                                           max_experiments=10)))
        assert p.meta["category"] != "architecture"


def test_a_long_sweep_without_keeps_never_runs_dry_or_repeats():
    h = History()
    seen = set()
    for i in range(120):  # five constants, nothing ever kept: it must keep finding new values
        p = KnobsProposer(seed=5).propose(h.ctx())
        assert p is not None, f"ran dry after {i} proposals"
        assert p.diff not in seen
        seen.add(p.diff)
        changes = {c["knob"]: c["new"] for c in p.meta.get("changes", [])} or {
            p.meta["knob"]: p.meta["new"]}
        h.run(changes, D, gain=-0.001 - 0.0005 * (i % 4))


def test_one_literal_reader_for_every_config_style():
    """Python's True/False and YAML/TOML/JSON's true/false read alike, wherever a knob lives."""
    assert [parse_literal(s) for s in ("True", "true", "False", "false")] == [
        True, True, False, False]
    assert parse_literal("1_000") == 1000 and parse_literal("3e-4") == 3e-4
    with pytest.raises(ValueError):
        parse_literal("'adamw'")


def test_one_run_pins_its_own_move_down_to_the_noise_and_leaves_the_rest_to_the_prior():
    step, scale = math.log(2.0), 1.0
    effect = Effect(scale, step)
    effect.observe((step * step, step), 2.0, 1.0)  # ×2 lost two gain scales
    assert effect.gain(step) == pytest.approx(-2.0, abs=0.1)
    # known to about the run's noise, half a gain scale (taking the whole gain scale as noise
    # left it 0.94 scales uncertain, as if the run had taught little)
    assert effect.spread(step) <= NOISE_SHARE * scale < 0.55 * scale
    assert effect.spread(-step) > 2 * scale  # the other way: still mostly the prior
    switch = Switch(scale)
    switch.observe(1.0, 2.0, 1.0)
    assert switch.mean() == pytest.approx(2.0, abs=0.2) and switch.spread() < 0.55 * scale
