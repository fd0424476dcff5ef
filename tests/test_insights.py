"""The sweep digest (agent.analysis.insights) for a hand-recorded sweep: every section's content."""

from __future__ import annotations

from dataclasses import replace

from test_knobs import SRC, C, D, History, K, sweep

from agent.analysis.insights import render
from agent.analysis.insights_fold import digest


def recorded() -> History:
    h = History(SRC)
    h.run({"LR": "6e-3"}, K, gain=0.05)  # 2
    h.run({"LR": "1.2e-2"}, K, gain=0.02)  # 3
    h.run({"LR": "2.4e-2"}, C, crash="FloatingPointError: loss is nan")  # 4
    h.run({"D_MODEL": "256"}, C, crash="torch.OutOfMemoryError: CUDA out of memory")  # 5
    h.run({"D_MODEL": "512"}, C, crash="torch.OutOfMemoryError: CUDA out of memory")  # 6
    h.run({"WARMUP": "0.2"}, D, gain=-0.0005)  # 7: a near-miss
    h.run({"USE_MUON": "True"}, D, gain=-0.02)  # 8
    for i, depth in enumerate(("8", "2", "6", "5", "3", "7")):  # 9..14: a plateau
        h.run({"DEPTH": depth}, D, gain=-0.01 - 0.001 * i)
    return h


def test_digest_of_a_recorded_sweep():
    h = recorded()
    found = digest(replace(sweep(), best_metric=h.best, name="nov30"), h.exps)
    assert found.counts == {"kept": 2, "crashed": 3, "discarded": 8}
    assert found.plateau.startswith("plateau: 11 runs without a keep (last keep #3)")
    lr = next(k for k in found.knobs if k.name == "LR")
    assert (lr.current, lr.runs, lr.kept, lr.crashed) == ("1.2e-2", 3, 2, 1)
    up = next(e for e in lr.effects if e.direction == "up")
    assert up.runs == 3 and up.kept == 2 and up.mean_gain == 0.035  # the crash has no gain
    depth = next(k for k in found.knobs if k.name == "DEPTH")
    assert depth.category == "architecture" and depth.values == ["8", "2", "6", "5", "3", "7"]
    assert {e.direction: e.runs for e in depth.effects} == {"up": 4, "down": 2}
    muon = next(k for k in found.knobs if k.name == "USE_MUON")
    assert [e.direction for e in muon.effects] == ["on"] and muon.category == "optimizer"
    assert found.crash_lessons == ["LR ≥ 0.024: nan (#4); avoid it",
                                   "D_MODEL ≥ 256: oom (#5, #6); avoid it"]
    assert len(found.near_misses) == 1 and found.near_misses[0].startswith(
        "#7 set {'WARMUP': '0.2'}: worse than the incumbent runs it was compared with by "
        "0.000500")
    cats = {c.category: c for c in found.categories}
    assert cats["architecture"].runs == 8 and cats["architecture"].note.startswith(
        "over-explored")
    assert cats["hyperparameter"].kept == 2 and cats["hyperparameter"].note == ""


def test_capped_categories_and_the_text_budget():
    h = recorded()
    s = replace(sweep(category_shares={"architecture": 0.4}), max_experiments=20,
                best_metric=h.best, name="nov30")
    found = digest(s, h.exps)
    arch = next(c for c in found.categories if c.category == "architecture")
    assert arch.note == "exhausted: 8 of 8 allowed (40% of 20 experiments)"
    text = render(found)
    order = [text.index(x) for x in ("# Sweep nov30", "## Crash lessons", "## Near-misses",
                                     "## Knobs tried", "## Categories")]
    assert order == sorted(order)
    assert "- LR [hyperparameter] now 1.2e-2; 3 runs, 1 crashed; tried 6e-3, 1.2e-2, 2.4e-2" \
        in text
    short = render(found, max_chars=600)
    assert len(short) <= 600 and "## Crash lessons" in short and "## Categories" not in short
    empty = render(digest(sweep(), h.exps[:1]))  # nothing run yet: three lines
    assert empty.count("\n") == 2 and "experiments: none yet" in empty
    assert "nothing kept yet" in empty


def test_a_change_stopped_early_has_no_gain_in_the_digest():
    """Stopped is not crashed, nor "+0": a change the early stop ended was never measured."""
    h = recorded()
    h.run({"WARMUP": "0.01"}, D, gain=-0.001)
    stopped = h.exps[-1]
    h.exps[-1] = replace(stopped, metric=None, meta={"verdict": {
        "ending": "stopped early", "change": {"runs": [], "values": []},
        "stopped": {"run": 9, "fraction": 0.3, "step": 120}}})
    found = digest(replace(sweep(), best_metric=h.best, name="nov30"), h.exps)
    warmup = next(k for k in found.knobs if k.name == "WARMUP")
    down = next(e for e in warmup.effects if e.direction == "down")
    assert (down.runs, down.stopped) == (1, 1)
    text = render(found)
    assert "down: stopped early over 1 (not measured)" in text and "down +0 " not in text


def test_a_free_form_change_is_better_or_worse_than_its_incumbent_runs_in_words():
    from agent.analysis.insights import area_insight
    from agent.analysis.trials import Trial
    from agent.core.domain import ExperimentStatus

    trial = Trial(12, ExperimentStatus.DISCARDED, "use SwiGLU", (), False, 0.009345, None, 0, {},
                  se=0.004)
    area = area_insight("architecture", 3, 0, 0, trial)
    # not "+0.009345", and not "than the best": the reference it was compared with, named
    assert area.best == ("#12 use SwiGLU (better than the incumbent runs it was compared with "
                         "by 0.009345 ± 0.004)")  # six decimals, as every screen writes a gain
    worse = area_insight("architecture", 3, 0, 0, replace(trial, gain=-0.02, se=None))
    assert worse.best == ("#12 use SwiGLU (worse than the incumbent runs it was compared with "
                          "by 0.020000)")
