"""The benchmark scripts: their arithmetic (benchmarks/ is not a package: loaded from its path),
and a small run of those cheap enough to run whole."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", ROOT / "benchmarks" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpt_cpu_tokens_per_s_counts_only_timed_steps() -> None:
    bench = _load("gpt_cpu")
    # 13 steps of 100k tokens, 3 of them untimed warm-up on CPU, 10 s on the training clock
    summary = {"num_steps": "13", "total_tokens_M": "1.300", "training_seconds": "10.0"}
    assert bench.timed_tokens_per_s(summary, "cpu") == pytest.approx(100_000)
    # all 13 steps over the timed seconds would claim 130k tokens/s
    # on CUDA the first 10 steps are untimed (compile)
    summary = {"num_steps": "30", "total_tokens_M": "3.000", "training_seconds": "4.0"}
    assert bench.timed_tokens_per_s(summary, "cuda") == pytest.approx(20 * 100_000 / 4.0)


def test_gpt_cpu_untimed_steps_match_train_py() -> None:
    bench = _load("gpt_cpu")
    src = (ROOT / "experiments" / "gpt" / "train.py").read_text()
    m = re.search(r'untimed_steps = (\d+) if device\.type == "cuda" else (\d+)', src)
    assert m, "train.py no longer states its untimed steps in the form the benchmark mirrors"
    assert (int(m[1]), int(m[2])) == (bench.UNTIMED_STEPS["cuda"], bench.UNTIMED_STEPS_OTHER)


def test_gpt_cpu_reads_the_device_line() -> None:
    bench = _load("gpt_cpu")
    out = "device cuda | data synthetic | params 1.00M | tokens/step 4096 | budget 60s\nstep 1"
    assert bench.device_of(out) == "cuda"
    assert bench.device_of("device cpu | data x\n") == "cpu"


def test_post_rate_reads_responses_and_takes_nearest_rank_quantiles() -> None:
    import asyncio

    bench = _load("post_rate")
    assert bench.pct([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert bench.pct([float(i) for i in range(100)], 0.99) == 98.0

    async def read() -> list[int]:
        reader = asyncio.StreamReader()
        body = b'{"id": 1}'
        reader.feed_data(b"HTTP/1.1 201 Created\r\ncontent-length: 9\r\n\r\n" + body
                         + b"HTTP/1.1 422 Unprocessable\r\nContent-Length: 2\r\n\r\n{}")
        reader.feed_eof()
        return [await bench.read_response(reader), await bench.read_response(reader)]

    assert asyncio.run(read()) == [201, 422]
    request = bench.request_bytes("127.0.0.1:1", {"a": 1})
    assert request.startswith(b"POST /experiments HTTP/1.1\r\n")
    assert request.endswith(b'\r\n\r\n{"a": 1}') and b"Content-Length: 8\r\n" in request


def test_slots_steady_rate_leaves_out_the_ramp_and_the_tail() -> None:
    from datetime import datetime, timedelta

    bench = _load("slots")
    t0 = datetime(2026, 1, 1)
    # Two slots, a 3 s cycle: the second slot claims its first run 1 s late (the ramp); after the
    # last start only idling is left (the tail). 8 starts; 6 of them from the 2nd start (t=1)
    # to the last (t=10): 6 runs in 9 s, whatever the ramp's length.
    starts = [t0 + timedelta(seconds=s) for s in (0, 1, 3, 4, 6, 7, 9, 10)]
    assert bench.steady_rate(starts, 2) == pytest.approx(6 / 9)
    late = [t0 + timedelta(seconds=s) for s in (0, 5, 7, 8, 10, 11, 13, 14)]
    assert bench.steady_rate(late, 2) == pytest.approx(6 / 9)
    assert bench.steady_rate(starts[:2], 2) is None  # no run started while both were busy
    assert bench.steady_rate([t0, t0, t0], 2) is None  # no span to divide by


def test_year_of_nights_runs_small_and_prints_every_surface(tmp_path: Path) -> None:
    """The script itself on 3 nights of 4: it fills, serves and prints each figure."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "year_of_nights.py"), "--nights", "3",
         "--per-night", "4", "--requests", "2"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "filled 3 nights × 4 experiments" in out.stdout
    for what in ("overnight status:", "GET /sweeps:", "GET /:", "GET /experiments?limit=50:",
                 "GET /ui/sweeps/night-001:", "list_sweeps([RUNNING]):", "overnight gc"):
        assert what in out.stdout, what


def test_the_chaos_plan_has_every_fault_and_only_those_asked_for() -> None:
    bench = _load("chaos")
    from chaos_fixtures import FAULTS

    faults = bench.plan(0, 30)
    assert len(faults) == 30 and set(faults) == set(FAULTS)
    assert bench.plan(0, 30) == faults  # seeded
    only = bench.plan(1, 5, ["disk_full", "freeze"])
    assert len(only) == 5 and set(only) == {"disk_full", "freeze"}


def _search() -> ModuleType:
    """benchmarks/search.py, registered (its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location("bench_search", ROOT / "benchmarks" / "search.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules["bench_search"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_search_closed_share_and_the_hardest_family() -> None:
    search = _search()

    def outcome(regret30: float, base: float = 0.2):  # type: ignore[no-untyped-def]
        return search.Outcome({30: regret30}, base, 0, 0, 0, False)

    assert search.closed(outcome(0.05), 30) == pytest.approx(0.75)
    assert search.closed(outcome(0.2), 30) == 0.0  # nothing gained
    results = {("a", "knobs"): [outcome(0.01), outcome(0.03), outcome(0.02)],  # median 0.9
               ("b", "knobs"): [outcome(0.05)] * 3,  # 0.75: the hardest
               ("b", "random"): [outcome(0.2)] * 3}  # other proposers do not count
    line = search.hardest(results)
    assert line.startswith("FAIL hardest family for knobs (b)") and "0.750" in line
    assert search.hardest({("a", "knobs"): results[("a", "knobs")]}).startswith("PASS")


def test_search_coupled_family_crash_regions_move_with_the_width() -> None:
    families = _load("search_families")
    best = {"LR": 6e-3, "WIDTH": 512, "DEPTH": 8, "BATCH_SIZE": 64, "WARMUP_FRAC": 0.05,
            "WEIGHT_DECAY": 0.05, "ADAM_BETA2": 0.98, "ROPE_BASE": 1e4, "USE_SWIGLU": True,
            "SOFTCAP": 15.0}
    assert families.coupled(best) == pytest.approx(families.OPTIMUM)
    assert families.coupled({**best, "ROPE_BASE": 5e3, "SOFTCAP": 30.0}) == \
        pytest.approx(families.OPTIMUM)  # two knobs do nothing
    narrow = {**best, "WIDTH": 256, "DEPTH": 6, "LR": 0.012}  # an LR tuned for a narrow model
    assert isinstance(families.coupled(narrow), float)
    assert families.coupled({**narrow, "WIDTH": 512}) == "nan"  # ...diverges once widened
    assert families.coupled({**best, "BATCH_SIZE": 96}) == "oom"  # the optimum is near the edge
    assert families.coupled({**best, "BATCH_SIZE": 68}) != "oom"


def test_search_simulation_of_the_coupled_family_gains_and_never_repeats() -> None:
    search = _search()
    a = search.simulate("coupled", "knobs", 3, 30)
    assert a == search.simulate("coupled", "knobs", 3, 30)  # deterministic for a seed
    assert a.repeats == 0 and a.crash_repeats <= 1
    assert search.closed(a, 30) > 0.5  # a wide margin: the median is ~0.94


def _search_rule(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # it imports keep_world
    return importlib.import_module("search_rule")  # dataclasses need it in sys.modules


def test_search_rule_breakdown_adds_up(monkeypatch: pytest.MonkeyPatch) -> None:
    sr = _search_rule(monkeypatch)
    heldout = sr.problem_of("coupled", 1, 0)
    assert heldout.live() == set(sr.values_of(sr.TRAIN_PY)) - {"ROPE_BASE", "SOFTCAP"}
    assert heldout.crash({**heldout.base, "BATCH_SIZE": 1000}) == "oom"
    assert heldout.crash({**heldout.base, "LR": 0.1}) == "nan"
    assert sr.problem_of(None, 1, 0).live() == set(sr.draw(sr.random.Random("problem-1-0")).weight)
    out = sr.one((7, 0, 12, "coupled"))
    n = sr.counts(out)
    assert len(out.steps) == 12 and sum(n[k] for k in sr.KINDS) == 12
    assert all(s.kind in sr.KINDS for s in out.steps)
    assert min(out.split) >= 0.0
    assert out.closed + sum(out.split) == pytest.approx(1.0)  # the split is the regret left
    assert n["revisit"] == 0  # the search never runs a configuration twice
    assert out.runs >= sum(s.runs for s in out.steps) >= 12
    assert set(out.knobs) == set(sr.KNOB_WHY) and min(out.knobs.values()) >= 0.0
    table = sr.breakdown([out, out], 12, per_problem=True)
    assert table.count("\n") == 6 and "| all 2 " in table and "never moved" in table
    idle = sr.one((7, 0, 0, "coupled"))  # no proposal: all the regret is in knobs never moved
    assert idle.closed == 0.0 and idle.split[0] == pytest.approx(1.0)
    assert idle.knobs["never moved"] > 0.5 and sum(idle.knobs.values()) == idle.knobs["never moved"]


def test_search_rule_oracles_hide_the_dead_knobs_and_the_noise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sr = _search_rule(monkeypatch)
    night = sr.SearchNight(sr.problem_of(None, 1, 0), 1000, oracle="dead")
    night.start()
    for k in range(12):
        night.step(k)
    assert night.hidden == set(night.problem.base) - night.problem.live() != set()
    assert "dead" not in {s.kind for s in night.steps}  # never moved a knob that does nothing
    assert sr.SKIP not in night.text and sr.SKIP in night.shown(night.text)
    assert sr.values_of(night.shown(night.text)).keys() == night.problem.live()
    quiet = sr.SearchNight(sr.problem_of(None, 1, 0), 1000, oracle="noise")
    quiet.start()
    assert quiet.history[0].metric == pytest.approx(quiet.problem(quiet.problem.base), abs=1e-6)
    assert sr.one((1, 0, 4, None, "both")).closed >= 0.0


def test_search_benchmarks_hand_the_search_its_gains(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search reads a run's gain from its verdict's record (agent.analysis.trials.gain_of):
    a benchmark that leaves the record out measures a search that learns nothing."""
    from agent.analysis.trials import trials
    from agent.core.domain import Direction

    sr = _search_rule(monkeypatch)
    night = sr.SearchNight(sr.problem_of("coupled", 7, 0), 7000)
    night.start()
    for k in range(8):
        night.step(k)
    ran = [t for t in trials(night.history, Direction.MINIMIZE) if t.crash is None]
    assert ran and all(t.gain is not None for t in ran)
    sim = _search().Simulation("coupled", "knobs", 3)
    for _ in range(8):
        sim.step()
    ran = [t for t in trials(sim.history, Direction.MINIMIZE)
           if t.status.value in ("kept", "discarded")]
    assert ran and all(t.gain is not None for t in ran)


def test_curve_world_shapes_and_a_fixed_budget_night(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # it imports keep_world
    cw = importlib.import_module("curve_world")  # dataclasses need it in sys.modules
    from agent.rules.decide import Rule
    from agent.rules.prune import PrunePolicy

    win = cw.Change(-2.0, "crossing", "data/schedule", hump=5.0, cross=0.6)
    assert win.delta(0.3) == pytest.approx(5.0) and win.delta(0.6) == pytest.approx(0.0)
    assert win.delta(1.0) == pytest.approx(-2.0)  # behind mid-run, ahead at the end
    assert cw.Change(2.0, "late", "architecture").delta(0.5) == 1.0
    world = cw.CurveWorld(budget=12.0)
    policy = cw.Policy(PrunePolicy())
    a = cw.simulate_budget(Rule(), world, policy, 3, seed=5)
    b = cw.simulate_budget(Rule(), world, policy, 3, seed=5)
    assert a.gains == b.gains and a.spent == b.spent and a.stopped == b.stopped
    spent = sum(a.spent.values())  # each night ends once its budget is spent
    assert 3 * 12.0 <= spent < 3 * 13.0
    assert a.finished_nights == 3
    broken = cw.simulate_budget(Rule(), cw.CurveWorld(budget=30.0, broken=1.0), policy, 3, seed=5)
    assert broken.stopped["check"] > 0  # a change 20–200σ worse is stopped early


def test_the_ladder_screens_at_a_fraction_that_costs_that_fraction(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    cw = importlib.import_module("curve_world")
    from agent.rules.decide import Rule

    world = cw.CurveWorld(budget=20.0)
    policy = cw.Policy(ladder=cw.Ladder(0.25, 0.5))  # no early stop: every full run costs 1
    a = cw.simulate_budget(Rule(), world, policy, 3, seed=5)
    assert a.gains == cw.simulate_budget(Rule(), world, policy, 3, seed=5).gains
    kinds = ("null", "harmful", "helpful")  # the tallies also count by kind and shape
    screens = sum(a.screens.get(k, 0) for k in kinds)
    assert screens > 0 and 0 < sum(a.screened_out.get(k, 0) for k in kinds) < screens
    # the GPU-seconds: one per full run, a quarter per screen; the screen is not a keep run
    assert sum(a.spent.values()) == pytest.approx(a.runs + 0.25 * screens)
    assert 3 * 20.0 <= sum(a.spent.values()) < 3 * 21.0
    assert a.lost_big <= a.lost_keeps <= a.screened_out.get("helpful", 0)
    plain = cw.simulate_budget(Rule(), world, cw.Policy(), 3, seed=5)
    assert not plain.screens and sum(plain.spent.values()) == plain.runs
    with pytest.raises(ValueError, match="fraction"):  # only at one of the early stop's checks
        cw.simulate_budget(Rule(), world, cw.Policy(ladder=cw.Ladder(0.3)), 1, seed=5)


def test_the_keep_worlds_are_seeded_and_the_held_out_ones_differ(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    kr = importlib.import_module("keep_rule")
    kw = importlib.import_module("keep_world")
    from agent.rules.decide import Rule

    a, b = (kw.simulate(Rule(), kw.World("s"), 3, seed=7) for _ in range(2))
    assert a.gains == b.gains and a.nights == b.nights and len(a.nights) == 3
    worlds = kr.heldout()
    assert len({(w.noise, w.noise_spread, w.drift, w.mix, w.shifting) for w in worlds}) == \
        len(worlds)
    rng = __import__("random").Random(1)
    assert {kw._effect(rng, "rare") for _ in range(500)} >= {0.0}
    spiky = [kw._noise(rng, "spikes") for _ in range(4000)]
    assert max(spiky) > 3.0 and sum(v > 3 for v in spiky) < 400




def test_keep_lost_sorts_every_unkept_clear_gain_by_how_it_ended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    kl = importlib.import_module("keep_lost")
    kw = importlib.import_module("keep_world")
    from agent.core.domain import ExperimentStatus
    from agent.core.record import Ending, Measured
    from agent.rules.decide import Rule, Verdict

    discard, one, four = ExperimentStatus.DISCARDED, Measured((1,), (1.0,)), Measured(
        (1, 2, 3, 4), (1.0,) * 4)
    no = Ending.NOT_BETTER
    assert kl.ending(Verdict(discard, "a first run keeps nothing", ending=no, change=one)) == \
        "first run"
    assert kl.ending(Verdict(discard, "x", ending=no, change=four, p_value=0.01,
                             level=0.002)) == "level"
    assert kl.ending(Verdict(discard, "x", ending=no, change=four, p_value=0.3,
                             level=0.02)) == "weak test"
    # by its ending, whatever its reason says
    assert kl.ending(Verdict(discard, "x", ending=Ending.NOT_JUDGED, change=four)) == \
        "not judged"
    for world, busy in ((kw.World("quiet"), False), (kw.World("busy", shifting=True), True)):
        tally, rng = kw.Tally(), __import__("random").Random(3)
        for _ in range(30):
            kw.Night(Rule(), world, rng).run(tally)
        assert len(tally.lost) == tally.big - tally.big_keeps > 0  # each unkept one, once
        assert any(b > 0 for _, b in tally.lost) is busy  # a quiet machine is never busy
    row = kl.lost_table(kw.World("quiet"), 3, seed=1)
    assert row.startswith("| quiet |") and row.count("%") == 5


def test_the_addis_ablation_runs_each_variant_and_puts_the_papers_values_back(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    ap = importlib.import_module("addis_params")
    from agent.rules import fdr

    monkeypatch.setattr(sys, "argv", ["addis_params.py", "--sweeps", "2"])
    assert ap.main() == 0
    lines = capsys.readouterr().out.splitlines()[2:]
    assert len(lines) == len(ap.worlds()) * len(ap.VARIANTS) == 15
    assert all("%" in line for line in lines)
    assert (fdr.TAU, fdr.LAMBDA) == (0.5, 0.25)


def _pace(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # it imports keep_world, curve_world
    return importlib.import_module("pace_gate")  # dataclasses need it in sys.modules


def test_the_pace_rows_run_beside_the_rule_in_each_night(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    pg = _pace(monkeypatch)
    kr = importlib.import_module("keep_rule")
    for argv in (["--pace", "--sweeps", "2", "--sigmas", "1", "--only", "stationary σ"],
                 ["--heldout", "--pace", "--sweeps", "2", "--only", "drift"],
                 ["--night", "budget", "--pace", "--sweeps", "1"]):
        monkeypatch.setattr(sys, "argv", ["keep_rule.py", *argv])
        kr.main()  # 1 or 2 nights may miss the rule's targets: the rows are what is checked
        out = capsys.readouterr().out
        for name in ("sequential", *pg.PEERS):
            assert sum(f"{name}  " in line and "%" in line for line in out.splitlines()) == (
                2 if "budget" in argv else 1), (argv, name)
    # the gate records its runs as the rule's night does: a pair is a run and one beside it
    tally = pg.simulate_pace(pg.Pace(0.05, 2), kr.World("s"), 2, seed=3)
    assert tally.proposals == 200 and tally.nulls > 0
    assert tally.runs == 2 * 5 + 2 * tally.beside  # the baselines, then pairs only
    assert 200 <= tally.beside <= 400 and len(tally.nights) == 2
    assert tally.nights == pg.simulate_pace(pg.Pace(0.05, 2), kr.World("s"), 2, seed=3).nights


def test_the_pace_e_value_is_the_bayes_factor_it_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    """The closed form against the integral it stands for: a half-normal prior on the gain in σ,
    1/σ on σ, the night's squared deviations as ν0 more observations of the noise."""
    import math

    import numpy as np
    from scipy import integrate, stats

    pg = _pace(monkeypatch)
    g = pg.SPREAD ** 2 / 2

    def like(theta: float, sig: float, x: np.ndarray, ss: float, df: int) -> float:
        """The pairs' d/√2 ~ N(θσ, σ²) and the night's ss ~ σ²χ²(df), as a function of θ, σ."""
        return float(sig ** -(df + len(x))
                     * math.exp(-(ss + ((x - sig * theta) ** 2).sum()) / (2 * sig ** 2)))

    for diffs, ss, df in (([1.3], 5.0, 4), ([0.4, -0.9, 2.2], 9.1, 7), ([-1.0, 0.2], 3.0, 3)):
        x = np.array(diffs) / math.sqrt(2)
        num = integrate.dblquad(lambda th, s, x=x, ss=ss, df=df: like(th, s, x, ss, df) * 2
                                * stats.norm.pdf(th, 0, g ** 0.5) / s, 1e-3, 40, 0, 30)[0]
        den = integrate.quad(lambda s, x=x, ss=ss, df=df: like(0.0, s, x, ss, df) / s, 1e-3, 40)[0]
        assert pg.e_value(diffs, ss, df) == pytest.approx(num / den, rel=1e-6)
    assert pg.e_value([5.0], 0.0, 0) == 1.0  # no σ̂ at all: one pair says nothing
    assert sum(pg.lond_gamma(j) for j in range(1, 100_000)) < 1.0


def test_the_pace_gate_keeps_a_null_change_at_most_alpha_at_any_stop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under H0 (a change that does nothing, stationary normal noise) the gate keeps at most
    α = 0.05, up to 3 standard errors over 400 nulls; it looks after each of 8 pairs. A gate
    that keeps when the pairs' mean favours the change, or a z-test at 0.05 after each pair
    (valid once, not at every stop), keeps far more and fails the same bound."""
    import math
    from statistics import NormalDist

    pg = _pace(monkeypatch)
    kw = importlib.import_module("keep_world")
    bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / 400)
    gate = pg.Pace(0.05, 8)
    assert pg.null_keep_rate(gate, 400, seed=11) <= bound
    z = NormalDist().inv_cdf(0.95)
    naive = {"mean d > 0": lambda d, ss, df: math.inf if sum(d) > 0 else 0.0,
             "z-test at every pair": lambda d, ss, df: math.inf if sum(d) / math.sqrt(
                 2 * len(d) * ss / df) > z else 0.0}
    for name, e_of in naive.items():
        assert pg.null_keep_rate(gate, 400, seed=11, gate=e_of) > bound, name
    # in the night itself: σ̂ from the night, every change null, the incumbent re-run when due
    monkeypatch.setattr(kw, "_effect", lambda rng, mix="default": 0.0)
    tally = pg.simulate_pace(pg.Pace(0.05, 4), kw.World("nulls", source=None), 4, seed=5)
    assert tally.nulls == 400 and tally.null_keeps / tally.nulls <= bound


def test_crossing_finds_a_change_behind_mid_run_and_better_at_the_end(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    cr = importlib.import_module("crossing")  # its dataclass needs it in sys.modules
    changed = (cr.copy_with(tmp_path, "LR", ("LR", "6e-3")) / "train.py").read_text()
    assert "LR = 6e-3  # AdamW peak LR" in changed and "EMBED_LR = 0.1" in changed
    with pytest.raises(SystemExit, match="NO_SUCH_KNOB"):
        cr.check_changes([("LR", "6e-3"), ("NO_SUCH_KNOB", "1")])

    def run(knob: str, value: str, seed: int, shift, final: float) -> dict:
        noise = (seed - 3) * 0.01
        curve = [(i / 20, 3 + 2 * (1 - i / 20) + shift(i / 20) + noise) for i in range(1, 21)]
        return {"knob": knob, "value": value, "seed": seed, "metric": final + noise,
                "curve": curve}

    runs = [run("baseline", "", s, lambda f: 0.0, 3.0) for s in range(1, 6)]
    # behind by 19 spreads until the warm-down, ahead at the end: a late crosser
    runs += [run("LR", "6e-3", s, lambda f: 0.3 if f <= 0.8 else -0.1, 2.9) for s in (1, 3, 5)]
    # 63 spreads behind (1.0 over a spread of 0.0158) from the start: stopped at the first check
    runs += [run("DEPTH", "2", s, lambda f: 1.0, 4.0) for s in (1, 3, 5)]
    rows = {r["change"]: r for r in cr.analyse({"steps": 20, "load": 0.0, "runs": runs})}
    lr, depth = rows["LR 6e-3"], rows["DEPTH 2"]
    assert lr["better"] and lr["crosses"] and lr["winner_stopped"]
    assert lr["category"] == "hyperparameter" and not lr["exempt"]
    assert depth["stops"] == ["25 %"] * 3 and not depth["better"] and not depth["crosses"]
    assert depth["gaps"][0] == pytest.approx(63.2, rel=0.01)
