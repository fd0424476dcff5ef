"""The digest's memos (agent.analysis.trials trials per live experiment, insights' exact
means per group of gains) change nothing: a digest over the same objects again, over objects
with a row finished out of order before them, and over fresh copies are all the digest of
fresh objects; remembered trials go when their experiments do."""

from __future__ import annotations

import copy
import gc
from dataclasses import replace

from test_insights import recorded
from test_knobs import D, K, sweep

from agent.analysis import trials as evidence
from agent.analysis.insights import render
from agent.analysis.insights_fold import digest
from agent.core.domain import Direction, ExperimentStatus


def _fresh(exps):  # type: ignore[no-untyped-def]
    """New objects, equal to `exps`: nothing remembered applies to them."""
    return [replace(e, meta=copy.deepcopy(e.meta)) for e in exps]


def test_a_digest_over_the_same_objects_is_the_digest_of_fresh_ones():
    h = recorded()
    s = replace(sweep(), best_metric=h.best)
    first = digest(s, h.exps)
    again = digest(s, h.exps)  # every trial remembered now
    assert again == first == digest(s, _fresh(h.exps))
    assert render(again) == render(first)
    a = evidence.trials(h.exps, Direction.MINIMIZE)
    assert all(x is y for x, y in zip(a, evidence.trials(h.exps, Direction.MINIMIZE),
                                      strict=True))


def test_an_earlier_row_finishing_late_moves_the_generations_after_it():
    """Two slots: #16 finished (discarded) before #15, which is then kept: every trial after
    #15 ran one generation later than the remembered trials say."""
    h = recorded()
    s = replace(sweep(), best_metric=h.best)
    h.run({"LR": "3e-3"}, D, gain=0.001)  # 15, still running when the page was drawn
    h.run({"WARMUP": "0.1"}, D, gain=-0.001)  # 16
    h.run({"DEPTH": "4"}, D, gain=-0.002)  # 17
    running = replace(h.exps[14], status=ExperimentStatus.RUNNING)
    before = [*h.exps[:14], running, *h.exps[15:]]
    digest(s, before)
    late = [*h.exps[:14], replace(h.exps[14], status=K), *h.exps[15:]]
    got = digest(s, late)
    assert got == digest(s, _fresh(late))
    gens = {t.id: t.generation for t in evidence.trials(late, Direction.MINIMIZE)}
    assert gens[16] == gens[15] + 1 == gens[17]


def test_remembered_trials_go_with_their_experiments():
    h = recorded()
    exps = _fresh(h.exps)
    evidence.trials(exps, Direction.MINIMIZE)
    ids = {id(e) for e in exps if not e.is_baseline}
    assert ids <= set(evidence._REMEMBERED)
    del exps
    gc.collect()
    assert not ids & set(evidence._REMEMBERED)
