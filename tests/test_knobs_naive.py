"""The former local-search proposer, `knobs-naive`: the baseline of benchmarks/search.py
(benchmarks/ is not a package: the module is loaded from its path)."""

import importlib.util
import sys
from pathlib import Path

from agent.core.config import TargetConfig
from agent.core.domain import Experiment, ExperimentStatus, Sweep, SweepStatus, utcnow
from agent.core.ports import ProposalContext
from agent.proposers.knobs import find_knobs

_SPEC = importlib.util.spec_from_file_location(
    "knobs_naive", Path(__file__).resolve().parent.parent / "benchmarks" / "knobs_naive.py")
assert _SPEC is not None and _SPEC.loader is not None
_NAIVE = sys.modules["knobs_naive"] = importlib.util.module_from_spec(_SPEC)  # its dataclasses
_SPEC.loader.exec_module(_NAIVE)
KnobsProposer, candidates = _NAIVE.NaiveKnobsProposer, _NAIVE.candidates

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


def sweep():
    return Sweep(
        1,
        "s",
        "/t",
        "overnight/s",
        SweepStatus.RUNNING,
        "knobs",
        TargetConfig(command="python train.py", editable=("train.py",), protected=(),
                 metric="val_bpb", budget_s=1, timeout_s=3),
        None,
        None,
        None,
        None,
        None,
        utcnow(),
    )


def ctx(history=(), src=SRC):
    return ProposalContext(sweep(), {"train.py": src}, list(history))


def test_find_knobs_reads_module_constants_only():
    names = [k.name for k in find_knobs("train.py", SRC)]
    assert names == ["DEPTH", "D_MODEL", "LR", "WARMUP", "USE_MUON"]


def test_candidates_per_type():
    knobs = {k.name: k for k in find_knobs("train.py", SRC)}
    assert candidates(knobs["D_MODEL"])[:4] == [(1, "256"), (-1, "64"), (1, "129"), (-1, "127")]
    assert candidates(knobs["DEPTH"])[0] == (1, "8")
    assert candidates(knobs["USE_MUON"]) == [(1, "True")]
    lr = [v for _, v in candidates(knobs["LR"])]
    assert lr[:2] == ["6e-3", "1.5e-3"]


def test_fraction_like_floats_never_cross_one_and_big_floats_stay_plain():
    beta = find_knobs("t.py", "BETA2 = 0.95\n")[0]
    values = [float(v) for _, v in candidates(beta)]
    assert values[:2] == [0.975, 0.9] and all(0 < v < 1 for v in values)
    small = find_knobs("t.py", "WARMUP = 0.4\n")[0]
    assert all(0 < float(v) < 1 for _, v in candidates(small))
    rope = find_knobs("t.py", "ROPE_BASE = 10000.0\n")[0]
    assert [v for _, v in candidates(rope)][:2] == ["20000.0", "5000.0"]


def test_deterministic_and_never_repeats():
    a = KnobsProposer(seed=7).propose(ctx())
    b = KnobsProposer(seed=7).propose(ctx())
    assert a == b and a.diff.startswith("--- a/train.py")
    history = []
    seen = set()
    for i in range(12):
        p = KnobsProposer(seed=7).propose(ctx(history))
        assert p is not None and p.diff not in seen
        seen.add(p.diff)
        history.append(
            Experiment(
                i + 1, 1, ExperimentStatus.DISCARDED, p.description, p.diff, "knobs", meta=p.meta
            )
        )


def test_prefers_a_direction_that_was_kept_and_backs_off_crashes():
    prop = KnobsProposer(seed=3)
    first = prop.propose(ctx())
    kept = Experiment(
        1, 1, ExperimentStatus.KEPT, first.description, first.diff, "knobs", meta=first.meta
    )
    m = first.meta
    head = SRC.replace(f"{m['knob']} = {m['old']}", f"{m['knob']} = {m['new']}")
    nxt = prop.propose(ctx([kept], head))
    # the same knob pushed further in the same direction, from the new head value
    assert (nxt.meta["knob"], nxt.meta["direction"], nxt.meta["old"]) == (
        m["knob"],
        m["direction"],
        m["new"],
    )
    crashed = Experiment(
        1, 1, ExperimentStatus.CRASHED, first.description, first.diff, "knobs", meta=first.meta
    )
    after_crash = prop.propose(ctx([crashed]))
    assert (after_crash.meta["knob"], after_crash.meta["direction"]) != (
        first.meta["knob"],
        first.meta["direction"],
    )


def test_specs_name_the_proposers():
    import pytest

    from agent.core.errors import ConfigError
    from overnight.runtime import make_proposer

    assert make_proposer("knobs", 1).name == "knobs"
    with pytest.raises(ConfigError, match="use knobs, queue or llm"):
        make_proposer("knobs-naive", 1)  # the former search is a benchmark's baseline now
