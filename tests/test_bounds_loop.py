"""What a keep weighs besides the metric, through the real loop (real git worktrees, real
subprocesses, a real SQLite file): a change that deletes a component with no effect is kept as
a simplification, and a change whose loss is far lower but whose peak memory passes the
ceiling of `[target.constraints]` is discarded with the bound as its reason; both records and
the CLI's results say so."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from conftest import make_target
from foreground import run_sweep
from test_one_record import Night, text_of

from agent.core.config import load_config
from agent.core.domain import Experiment, ExperimentStatus, Proposal
from agent.core.ports import ProposalContext
from agent.core.record import Ending
from agent.engine.loop import Loop, LoopSettings
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo
from agent.ops.sweeps import create_sweep
from agent.proposers.knobs import make_diff
from db.engine import open_database
from db.store import SqlStore

TRAINER = (Path(__file__).parent / "scripts" / "weigh_trainer.py").read_text()
TOML = textwrap.dedent("""\
    [target]
    command   = "python train.py"
    editable  = ["train.py"]
    protected = ["prepare.py", "overnight.toml"]
    metric    = "val_loss"
    direction = "minimize"
    budget_s  = 0.05
    timeout_s = 30
    simplicity_margin = 0.05
    secondary = ["peak_memory_mb"]

    [target.constraints]
    peak_memory_mb = "<= 5000"
    """)


def without_smooth(text: str) -> str:
    start, end = text.index("def smooth"), text.index("seed = int")
    return text[:start] + text[end:].replace("loss = smooth(loss)\n", "")


class Changes:
    """Deletes the component, then widens the model past the memory ceiling."""

    name = "changes"
    out_of_ideas: str | None = None

    def __init__(self) -> None:
        self.k = 0

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        self.k += 1
        text = ctx.files["train.py"]
        if self.k == 1:
            return Proposal("remove smooth()", make_diff("train.py", text, without_smooth(text)),
                            self.name)
        if self.k == 2:
            return Proposal("LAYERS 4 -> 12", make_diff(
                "train.py", text, text.replace("LAYERS = 4", "LAYERS = 12")), self.name)
        return None

    def repair(self, ctx: ProposalContext, failed: Experiment) -> Proposal | None:
        return None


@pytest.fixture(scope="module")
def night(tmp_path_factory: pytest.TempPathFactory) -> tuple[SqlStore, list[Experiment], Path]:
    root = tmp_path_factory.mktemp("weigh")
    target = make_target(root / "target", edits={"train.py": TRAINER, "overnight.toml": TOML})
    db = root / "overnight.db"
    store = SqlStore(open_database(db))
    sweep = create_sweep(store, GitRepo(target), target, name="weigh",
                         config=load_config(target), max_experiments=2)
    loop = Loop(store, GitRepo(target), SubprocessRunner(grace_s=0.5),
                LoopSettings(root / "work", grace_s=0.5), proposer=Changes())
    run_sweep(loop, sweep.name)
    return store, store.list_experiments(sweep.id), db


def test_a_change_that_deletes_a_component_with_no_effect_is_kept_as_a_simplification(night):
    _, exps, _ = night
    simpler = next(e for e in exps if e.description == "remove smooth()")
    assert simpler.status is ExperimentStatus.KEPT, simpler.reason
    rec = simpler.record
    assert rec is not None and rec.ending is Ending.KEPT and rec.simpler
    assert rec.lines is not None and rec.lines <= -6 and rec.margin == pytest.approx(-0.05)
    assert "a simplification (" in (simpler.reason or "")
    assert "kept unless worse by more than 0.050000" in (simpler.reason or "")


def test_a_change_past_the_memory_ceiling_is_discarded_with_its_reason(night):
    store, exps, _ = night
    wide = next(e for e in exps if e.description == "LAYERS 4 -> 12")
    assert wide.status is ExperimentStatus.DISCARDED
    rec = wide.record
    assert rec is not None and rec.ending is Ending.OVER_BOUND
    assert rec.p is None  # no test in the night's ledger
    assert (wide.reason or "").startswith("over a bound: peak_memory_mb 7") and \
        "over its bound <= 5000" in (wide.reason or "")
    # its loss was far lower: the metric alone would have kept it
    assert rec.difference is not None and rec.difference < -0.1
    check = rec.bounds[0]
    assert check.broken and check.value is not None and check.value > 5000


def test_every_screen_says_what_each_weighed(night):
    store, exps, db = night
    seen = Night(store, exps[0].sweep_id, db)
    simpler = next(e for e in exps if e.description == "remove smooth()")
    wide = next(e for e in exps if e.description == "LAYERS 4 -> 12")
    weighed = "simpler: 9 lines fewer, kept as not worse than the incumbent by more than 0.050000"
    # the morning report (markdown) and the dashboard's report: beside the keep's gain
    md = seen.cli("report", "--sweep", "weigh")
    row = next(line for line in md.splitlines() if line.startswith(f"| {simpler.id} |"))
    assert weighed in row and "train.py +0 −9" in row
    assert text_of(seen.pages["report"], f"weighed-{simpler.id}") == weighed
    # the experiment pages: the keep's weighing; the discard's reason names the bound
    assert text_of(seen.pages[f"exp{simpler.id}"], "weighed").endswith(f": {weighed}")
    assert 'id="weighed"' not in seen.pages[f"exp{wide.id}"]
    assert "over a bound: peak_memory_mb" in seen.pages[f"exp{wide.id}"]
    # the console's table and its JSON
    assert "over a bound: peak_memory_mb" in seen.cli("results", "--sweep", "weigh")
    rows = {r["id"]: r for r in seen.json["experiments"]}
    assert rows[wide.id]["status"] == "discarded"
    assert rows[wide.id]["reason"].startswith("over a bound: peak_memory_mb")
    # the search learns the bound: a region to avoid, and no near-miss to re-test
    assert "- LAYERS ≥ 12: over a bound (#3); avoid it" in md
    knob = next(line for line in md.splitlines() if line.startswith("- LAYERS [architecture]"))
    assert "crashed" not in knob  # discarded past a bound, not a crash
    assert "Near-misses" not in md


def test_a_keep_that_adds_code_for_a_gain_under_the_margin_is_flagged():
    from agent.analysis.words import weighed
    from agent.core.record import Measured, VerdictRecord

    rec = VerdictRecord(Ending.KEPT, Measured((5,), (2.99,)), difference=-0.01, lines=40)
    assert weighed(rec, 0.05, minimize=True) == (
        "small gain for its code: 40 lines more for a gain of 0.010000, under the simplicity "
        "margin 0.050000")
    assert weighed(rec, 0.0, minimize=True) == ""  # no margin: nothing to weigh it against
    big = VerdictRecord(Ending.KEPT, Measured((5,), (2.9,)), difference=-0.1, lines=40)
    assert weighed(big, 0.05, minimize=True) == ""
