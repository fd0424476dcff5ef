"""What ends a script's training before its budget (the step or epoch count doctor names), the
budget adopt derives from a probe that ended by itself, and the sentence for a script with no
knob. Pure functions over source text and a probe's record."""

from __future__ import annotations

import pytest

from agent.ops.adopt_probe import Probe, budget_for
from agent.ops.budget_caps import cap_advice, find_cap
from agent.proposers.knob_sources import how_to_give_knobs

BUDGET = ("import os, time, itertools\nbudget = float(os.environ['OVERNIGHT_BUDGET_S'])\n"
          "deadline = time.time() + budget\n")
CHECK = "if time.time() > deadline:"


@pytest.mark.parametrize("body,line,count,nested", [
    # the check breaks the batch loop only: the epochs end training
    (f"def main(epochs=3):\n    for epoch in range(epochs):\n        for b in range(9):\n"
     f"            {CHECK}\n                break\n", 5, "epochs", True),
    (f"for epoch in range(1, args.epochs + 1):\n    {CHECK}\n        break\n", 4, "epochs", False),
    (f"while step < cfg.max_steps:\n    step += 1\n    {CHECK}\n        break\n", 4,
     "max_steps", False),
    (f"while True:\n    step += 1\n    if loss > 100:\n        break\n    if step >= max_iters:\n"
     f"        break\n    {CHECK}\n        break\n", 8, "max_iters", False),
    (f"for xb in loader:\n    {CHECK}\n        break\n", 4, None, False),  # one pass
    (f"def f(epochs):\n    for e in range(epochs):\n        for b in x:\n            {CHECK}\n"
     f"                return\n", 5, "epochs", False),  # a return ends both loops
])
def test_the_count_that_ends_training_first(body: str, line: int, count: str | None,
                                            nested: bool):
    cap = find_cap({"train.py": BUDGET + body})
    assert cap is not None and (cap.line, cap.count, cap.nested) == (line, count, nested)


@pytest.mark.parametrize("body", [
    f"for step in itertools.count():\n    {CHECK}\n        break\n",
    f"for step in range(10**9):\n    {CHECK}\n        break\n",
    f"for step in range(5_000_000):\n    {CHECK}\n        break\n",
    "while time.time() < deadline:\n    step()\n",
    f"while True:\n    if loss > 100:\n        break\n    {CHECK}\n        break\n",
])
def test_loops_that_only_the_budget_ends_have_no_cap(body: str):
    assert find_cap({"train.py": BUDGET + body}) is None


def test_a_script_that_reads_no_budget_is_capped_by_its_training_loop():
    text = "for epoch in range(epochs):\n    loss.backward()\n    opt.step()\n"
    cap = find_cap({"notes.txt": "x", "train.py": text})
    assert cap is not None and (cap.line, cap.check_line) == (1, None)


def test_the_advice_names_the_line_and_where_the_count_is_set():
    cap = find_cap({"train.py": BUDGET + "def main(epochs=3):\n    for epoch in range(epochs):\n"
                    f"        for b in range(9):\n            {CHECK}\n                break\n"})
    what, fix = cap_advice(cap, "train.py:4")
    assert what == "`for epoch in range(epochs):` (train.py:5) ends training first"
    assert fix == ("let the budget end training: loop with `itertools.count()` instead of "
                   "`range(...)` at train.py:5, and break that loop too when the budget is spent "
                   "(the check at line 7 breaks only the loop inside it), or set epochs "
                   "(train.py:4) so high that the budget always ends training first")
    what, fix = cap_advice(None)
    assert "reads OVERNIGHT_BUDGET_S" in what and fix.startswith("let the budget end training")


def test_a_probe_that_ended_by_itself_gives_the_budget_its_training_time():
    ended = Probe([], wall_s=1.4, ended="finished", summary={"training_seconds": 0.7})
    assert ended.trained_s == 0.7 and budget_for(0.7) == 1.0
    assert Probe([], 1.4, "finished").trained_s == 1.4  # no block: its wall time
    assert Probe([], 10.0, "stopped after 3 lines with a loss").trained_s is None
    assert Probe([], 2.0, "failed").trained_s is None
    # a run that trained as long as the probe's own budget read the budget: not its own end
    assert Probe([], 60.5, "finished", summary={"training_seconds": 59.9}).trained_s is None
    assert [budget_for(s) for s in (0.01, 4.1, 9.0, 25.0, 1e4)] == [1, 10, 15, 45, 300]


def test_the_sentence_for_a_script_without_knobs_uses_its_own_flags():
    text = "p.add_argument('--lr', type=float)\np.add_argument(\"--n-layer\")\n'--help'\n"
    said = how_to_give_knobs("train.py", text, "python train.py", adopted="/r")
    assert said == ("give train.py the hyper-parameters to search as flags in adopt's command "
                    "(`overnight adopt /r --force --command 'python train.py --lr <value> "
                    "--n-layer <value>'` writes them into overnight.args, for a sweep to "
                    "change), or as constants at its top (`LR = 0.001`)")
    said = how_to_give_knobs("train.py", "x = compute()\n", "python train.py")
    assert "in an args_file (`--lr 0.001` in overnight.args" in said
