"""The line a person reads per finished experiment (overnight.console): which reasons it shows."""

from __future__ import annotations

import pytest
from record_fixtures import record, recorded

from agent.core.domain import Experiment, ExperimentStatus
from agent.core.record import Ending
from overnight.console import describe


def _exp(status: ExperimentStatus, reason: str | None) -> Experiment:
    return Experiment(1, 1, status, "D_MODEL 128 -> 256", "", "knobs", reason=reason)


@pytest.mark.parametrize("status, ending, reason", [
    (ExperimentStatus.KEPT, Ending.KEPT, "better: mean 3.41 of 2 runs: better than the "
     "incumbent's 2 runs at its speed (mean 3.52) by 0.11 ± 0.02 (σ̂ 0.02, 9 df): t 3.1, "
     "p 0.0003, level 0.0004"),
    (ExperimentStatus.DISCARDED, Ending.NOT_BETTER, "not better: 3.6 on 1 run: worse than …"),
    (ExperimentStatus.DISCARDED, Ending.NOT_BETTER, "not better: t 1.2, p 0.13, level 0.003"),
    (ExperimentStatus.KEPT, Ending.BASELINE, "baseline: the mean of 5 runs"),
])
def test_a_plain_keep_or_not_better_shows_the_description_alone(
        status: ExperimentStatus, ending: Ending, reason: str) -> None:
    # plain: the record says so (its ending), not the reason's first words
    exp = recorded(_exp(status, reason), record(ending, [3.41]))
    assert describe(exp) == "D_MODEL 128 -> 256"
    assert describe(_exp(status, reason)) == f"D_MODEL 128 -> 256  [{reason}]"  # no record


@pytest.mark.parametrize("status, reason", [
    (ExperimentStatus.DISCARDED, "run 2 (seed 43) failed: timed out after 12 s"),
    (ExperimentStatus.DISCARDED, "stopped at 25 % of the budget: loss 4.31 over 0–25 % vs the "
                                 "incumbent's 4.01 ± 0.030 there"),
    (ExperimentStatus.DISCARDED, "not judged: the machine's speed kept changing around its runs"),
    (ExperimentStatus.CRASHED, "NameError: name 'x' is not defined"),
])
def test_any_other_outcome_names_its_reason(status: ExperimentStatus, reason: str) -> None:
    # e.g. a discard whose second run timed out: its delta alone looks like a gain
    assert describe(_exp(status, reason)) == f"D_MODEL 128 -> 256  [{reason}]"
    for ending in (Ending.RUN_FAILED, Ending.STOPPED_EARLY, Ending.NOT_JUDGED, Ending.CRASHED):
        exp = recorded(_exp(status, reason), record(ending, [3.41]))
        assert describe(exp) == f"D_MODEL 128 -> 256  [{reason}]"


def test_the_closing_line_says_when_the_baseline_was_re_measured():
    from types import SimpleNamespace

    from overnight.cli_results import closing_line

    def sweep(baseline: float, best: float) -> SimpleNamespace:
        return SimpleNamespace(metric="val_bpb", baseline_metric=baseline, best_metric=best,
                               direction=SimpleNamespace(value="minimize"))

    base = SimpleNamespace(is_baseline=True, status=ExperimentStatus.KEPT, metric=6.702885,
                           commit=None)
    tried = SimpleNamespace(is_baseline=False, status=ExperimentStatus.DISCARDED, metric=5.4)
    line = closing_line(sweep(6.222968, 6.222968), [base, tried])  # type: ignore[arg-type]
    assert line == ("no change beat the baseline: val_bpb baseline 6.222968 (now, 6.702885 at "
                    "its verdict); 0 of 1 change kept (the baseline aside); the branch is "
                    "unchanged")
    line = closing_line(sweep(6.702885, 6.702885), [base, tried])  # type: ignore[arg-type]
    assert "verdict" not in line and "baseline 6.702885; 0 of 1 change kept" in line


def test_a_discard_with_no_value_is_not_written_as_a_crash_in_results_tsv():
    from types import SimpleNamespace

    from agent.analysis.report import results_tsv

    unjudged = _exp(ExperimentStatus.DISCARDED, "not judged: better beside the incumbent (…), "
                    "but the machine's speed kept changing around its runs (its speed over the "
                    "incumbent's: ×2.4, ×1.3)")
    crashed = Experiment(2, 1, ExperimentStatus.CRASHED, "D_MODEL 256 -> 512", "", "knobs")
    tsv = results_tsv(SimpleNamespace(metric="val_bpb"), [unjudged, crashed])  # type: ignore[arg-type]
    rows = [line.split("\t") for line in tsv.splitlines()[1:]]
    assert rows[0][1:4] == ["", "0.0", "discard"] and rows[1][1:4] == ["0.000000", "0.0", "crash"]
    assert describe(unjudged).endswith("×2.4, ×1.3)]")


def test_the_results_table_leaves_memory_blank_when_the_script_reported_none() -> None:
    """A CPU script that prints no peak_memory_mb ran with memory: not "0.0" (results.tsv
    keeps autoresearch's 0.0)."""
    from dataclasses import replace
    from datetime import UTC, datetime

    from rich.console import Console
    from test_store_contract import CONFIG

    from agent.analysis.report import results_tsv
    from agent.core.domain import Sweep, SweepStatus
    from overnight.console import results_table

    sweep = Sweep(1, "s", "/t", "overnight/s", SweepStatus.DONE, "knobs", CONFIG, None, 1.0,
                  1.0, None, None, datetime(2026, 12, 1, tzinfo=UTC))
    cpu = replace(_exp(ExperimentStatus.DISCARDED, None), summary={"val_bpb": 1.1})
    gpu = replace(cpu, id=2, description="DEPTH 4 -> 8", summary={"peak_vram_mb": 2048.0})
    out = Console(width=200, record=True)
    out.print(results_table(sweep, [cpu, gpu]))
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")]
            for line in out.export_text().splitlines() if line.startswith("│")}
    assert rows["1"][8] == "" and rows["2"][8] == "2.0", rows
    assert results_tsv(sweep, [cpu]).splitlines()[1].split("\t")[2] == "0.0"


@pytest.mark.parametrize("ending, p_better, p, expected", [
    # judged not better although it was probably better: the sentence says what it lacked
    (Ending.NOT_BETTER, 0.97, 0.042, "P(better) 0.97 is not enough: a keep needs p at or below "
     "the level, and its p was 0.042 against a level of 0.013."),  # as the reason writes p, level
    (Ending.NOT_BETTER, 0.64, None, "P(better) 0.64 is not enough: a keep needs a test at the "
     "night's level, and this change was not given one."),
    (Ending.NOT_BETTER, 0.26, 1.0, None),  # probably worse: nothing to explain
    (Ending.KEPT, 0.999, 0.0001, None),
])
def test_a_discard_that_was_probably_better_says_why_that_was_not_enough(
        ending: Ending, p_better: float, p: float | None, expected: str | None) -> None:
    import io

    from rich.console import Console
    from test_store_contract import CONFIG

    from agent.analysis.words import why_not_kept
    from agent.core.domain import Sweep, SweepStatus
    from overnight.console import LineLog

    found = record(ending, [3.41, 3.40], compared=[3.45, 3.46], se=0.02, p_better=p_better,
                   p=p, level=0.0125 if p is not None else None)
    assert why_not_kept(found) == expected
    status = ExperimentStatus.KEPT if ending == Ending.KEPT else ExperimentStatus.DISCARDED
    exp = recorded(_exp(status, "not better: …"), found)
    from datetime import UTC, datetime
    sweep = Sweep(1, "s", "/t", "overnight/s", SweepStatus.RUNNING, "knobs", CONFIG, None, 1.0,
                  1.0, None, None, datetime(2026, 12, 1, tzinfo=UTC))
    out = io.StringIO()
    LineLog(Console(file=out, width=300), sweep).on_event("finished", exp, {})
    line = out.getvalue()
    assert (f"[{expected}]" in line) if expected else "is not enough" not in line, line


def test_the_results_table_shows_each_secondary_key_over_the_records_runs_only() -> None:
    """A kept change on runs 1 and 2 with run 3 set aside: each `[target] secondary` key's
    column is the mean of runs 1 and 2 that printed it ("–" when none did); without the key
    the table has no such column."""
    from datetime import UTC, datetime

    from rich.console import Console
    from test_store_contract import CONFIG

    from agent.analysis.secondary import secondary_json, secondary_means
    from agent.core.config import TargetConfig
    from agent.core.domain import Run, RunRole, RunStatus, Sweep, SweepStatus
    from overnight.console import results_table

    def sweep(config: TargetConfig) -> Sweep:
        return Sweep(1, "s", "/t", "overnight/s", SweepStatus.DONE, "knobs", config, None, 1.0,
                     1.0, None, None, datetime(2026, 12, 1, tzinfo=UTC))

    def run(i: int, status: RunStatus, **summary: float) -> Run:
        return Run(i, 1, 1, "c", 41 + i, RunRole.SCREEN, status, 3.4, summary=summary)

    exp = recorded(_exp(ExperimentStatus.KEPT, None),
                   record(Ending.KEPT, [3.41, 3.39], set_aside=(3,)))
    runs = [run(1, RunStatus.OK, peak_vram_mb=40960.0, mfu_percent=31.0),
            run(2, RunStatus.OK, peak_vram_mb=40000.0),
            run(3, RunStatus.SUSPECT, peak_vram_mb=99999.0, mfu_percent=90.0, tokens_per_s=1.0)]
    keys = ["peak_vram_mb", "mfu_percent", "tokens_per_s"]
    named = sweep(TargetConfig.from_dict({**CONFIG.to_dict(), "secondary": keys}))
    assert secondary_json(secondary_means(exp.record, runs, keys)) == {
        "peak_vram_mb": {"mean": 40480.0, "n": 2}, "mfu_percent": {"mean": 31.0, "n": 1},
        "tokens_per_s": {"mean": None, "n": 0}}

    def table(s: Sweep) -> tuple[list[str], list[str]]:
        out = Console(width=300, record=True)
        out.print(results_table(s, [exp], runs=runs))
        lines = out.export_text().splitlines()
        head = [c.strip() for c in [x for x in lines if x.startswith("┃")][-1].split("┃")]
        row = [c.strip() for c in [x for x in lines if x.startswith("│")][0].split("│")]
        return head, row

    head, row = table(named)
    assert head[8:11] == [f"{k} (measured)" for k in keys]
    assert row[8:11] == ["40480", "31", "–"]  # no exponent
    head, row = table(sweep(CONFIG))  # no secondary key: the columns of today
    assert not any(h.endswith("(measured)") for h in head if not h.startswith(CONFIG.metric))
    assert head[8:11] == ["mem GB", "train s", "description"]
