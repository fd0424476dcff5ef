"""The sealed final exam: a target's `holdout_metric` (tests/fixtures/scale_target: its protected
prepare.py prints `holdout_bpb:` at exit, after train.py's summary lines) is recorded on each
run and seen by no proposer during the night. Each channel a proposer or a person reads is
searched for every recorded holdout value: the live lines, the log files, the records' summary
and log tail, the language model's prompts, the insights, MCP's tools, the API and the
dashboard over the real server. The report shows it once the night has ended.

The night runs through the real loop (real git, real subprocesses, a real SQLite file); the
server is `overnight serve` on loopback with no slots (it only reads).
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import FIXTURES, make_target
from foreground import run_sweep
from service_fixtures import ServerProcess

from agent.analysis.insights import render
from agent.analysis.insights_fold import digest
from agent.analysis.morning_md import render_markdown
from agent.core.config import load_config
from agent.core.diff import make_diff
from agent.core.domain import Experiment, ExperimentStatus, Proposal, RunStatus, SweepStatus
from agent.core.ports import ProposalContext
from agent.engine.loop import Loop, LoopSettings
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo
from agent.ops.morning import report_of
from agent.ops.sweeps import create_sweep
from agent.proposers.llm import propose_prompt, repair_prompt
from api.dashboard.report_html import render_html
from api.mcp.tools import AgentTools
from db.engine import open_database
from db.store import SqlStore
from overnight.runtime import Runtime

CRASH = ('print("peak_memory_mb:   1024.0")',
         'print("peak_memory_mb:   1024.0")\nraise RuntimeError("boom after the summary")')
EDITS = [("USE_GOOD on", "USE_GOOD = False", "USE_GOOD = True"),
         ("crash after the summary", *CRASH),
         ("USE_FAST on", "USE_FAST = False", "USE_FAST = True")]


class Recording:
    """Proposes EDITS in order and keeps every context it was shown (a proposer's view)."""

    name = "knobs"
    out_of_ideas: str | None = None

    def __init__(self) -> None:
        self.edits = list(EDITS)
        self.seen: list[ProposalContext] = []
        self.repairs: list[tuple[ProposalContext, Experiment]] = []

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        self.seen.append(ctx)
        if not self.edits:
            return None
        what, old, new = self.edits.pop(0)
        text = ctx.files["train.py"]
        return Proposal(what, make_diff("train.py", text, text.replace(old, new)), "knobs")

    def repair(self, ctx: ProposalContext, failed: Experiment) -> None:
        self.repairs.append((ctx, failed))
        return None


@pytest.fixture(scope="module")
def sealed_night(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("holdout")
    target = make_target(root / "target", FIXTURES / "scale_target")
    db = root / "overnight.db"
    store = SqlStore(open_database(db))
    repo = GitRepo(target)
    create_sweep(store, repo, target, name="night", config=load_config(target),
                 max_experiments=len(EDITS))
    lines: list[str] = []

    def on_event(kind: str, exp: Experiment, data: dict[str, Any]) -> None:
        if kind == "line":
            lines.append(str(data.get("line")))

    proposer = Recording()
    loop = Loop(store, repo, SubprocessRunner(grace_s=0.5), LoopSettings(root / "work"),
                proposer=proposer, on_event=on_event)  # type: ignore[arg-type]
    run_sweep(loop, "night")
    sweep = store.get_sweep("night")
    runs = store.list_runs(sweep_id=sweep.id)
    values = sorted({f"{r.holdout:.6f}" for r in runs if r.holdout is not None})
    return {"root": root, "db": db, "store": store, "sweep": sweep, "runs": runs,
            "values": values, "lines": lines, "proposer": proposer}


def leaks(values: list[str], text: str) -> list[str]:
    return [v for v in values if v in text]


def test_each_run_records_its_holdout(sealed_night):
    runs, values = sealed_night["runs"], sealed_night["values"]
    ok = [r for r in runs if r.status is RunStatus.OK]
    assert len(ok) >= 3 and all(r.holdout is not None for r in ok)
    assert len(values) >= 3  # the baseline's seeds and the changes differ
    for r in ok:  # the fixture's truth: the holdout sits 0.02 above, USE_FAST's gain absent
        assert r.metric is not None and r.holdout is not None
        assert 0.0 < r.holdout - r.metric < 0.1
        assert "holdout_bpb" not in r.summary and "val_bpb" in r.summary
    crashed = [e for e in sealed_night["store"].list_experiments(sealed_night["sweep"].id)
               if e.status is ExperimentStatus.CRASHED]
    assert [e.description for e in crashed] == ["crash after the summary"]
    assert "holdout_bpb: sealed" in (crashed[0].log_tail or "")  # printed, then sealed


def test_the_night_never_shows_it(sealed_night):
    values, store, sweep = sealed_night["values"], sealed_night["store"], sealed_night["sweep"]
    assert any("val_bpb" in line for line in sealed_night["lines"])  # the lines were heard
    assert leaks(values, "\n".join(sealed_night["lines"])) == []
    logs = list((sealed_night["root"] / "work" / "logs" / "night").glob("*.log"))
    assert len(logs) >= 4
    for log in logs:
        assert leaks(values, log.read_text()) == [], log
    exps = store.list_experiments(sweep.id)
    for e in exps:
        assert leaks(values, repr(e.summary) + (e.log_tail or "") + (e.reason or "")) == []
    for r in sealed_night["runs"]:
        assert leaks(values, repr(r.summary) + (r.note or "")) == []
    # The language model's prompts, from what the loop showed the proposer, and at the end.
    proposer: Recording = sealed_night["proposer"]
    final = ProposalContext(sweep, {"train.py": ""}, exps)
    assert len(proposer.seen) >= 3
    for ctx in [*proposer.seen, final]:
        assert leaks(values, propose_prompt(ctx, 8000)) == []
    crashed = next(e for e in exps if e.status is ExperimentStatus.CRASHED)
    assert "holdout_bpb: sealed" in repair_prompt(final, crashed, 8000)
    assert leaks(values, repair_prompt(final, crashed, 8000)) == []
    # The insights.
    assert leaks(values, render(digest(sweep, exps), 8000)) == []


def test_mcp_api_and_dashboard_never_show_it_while_the_sweep_runs(sealed_night):
    values, db, store = sealed_night["values"], sealed_night["db"], sealed_night["store"]
    store.set_sweep_status("night", SweepStatus.RUNNING)
    try:
        exps = store.list_experiments(sealed_night["sweep"].id)
        tools = AgentTools(Runtime(db).service)
        seen = [repr(tools.get_target("night")), repr(tools.get_best("night")),
                repr(tools.list_experiments("night")), tools.get_results_table("night"),
                repr(tools.get_insights("night")), tools.get_report("night")]
        seen += [repr(tools.get_log(e.id)) for e in exps]
        assert "Sealed while the sweep runs" in tools.get_report("night")
        assert leaks(values, "\n".join(seen)) == []

        # A run still writing its log has printed the line and is not sealed yet: what the
        # API and the dashboard read from a log file is sealed as it is read.
        with open(exps[0].log_path or "", "a") as fh:
            fh.write(f"holdout_bpb:      {values[0]}\n")
        root = sealed_night["root"]
        srv = ServerProcess(db, log=root / "server.log", slots=0).start()
        try:
            with srv.client() as c:
                paths = ["/sweeps", "/sweeps/night", "/sweeps/night/best",
                         "/sweeps/night/results.tsv", "/sweeps/night/insights",
                         "/experiments?sweep=night&limit=200", "/ui/", "/ui/sweeps/night",
                         "/ui/sweeps/night/live", "/ui/sweeps/night/report",
                         "/ui/sweeps/night/report.md"]
                for e in exps:
                    paths += [f"/experiments/{e.id}", f"/experiments/{e.id}/log",
                              f"/experiments/{e.id}/log?follow=1", f"/ui/experiments/{e.id}",
                              f"/ui/experiments/{e.id}/tail", f"/ui/experiments/{e.id}/log.txt"]
                for path in paths:
                    r = c.get(path)
                    assert r.status_code == 200, (path, r.status_code, r.text[:300])
                    assert leaks(values, r.text) == [], path
                log = c.get(f"/experiments/{exps[0].id}/log").text
                assert "val_bpb" in log and "holdout_bpb: sealed" in log
        finally:
            srv.stop()
    finally:
        store.set_sweep_status("night", SweepStatus.DONE)


def test_the_report_after_the_night_shows_validation_vs_holdout(sealed_night):
    store, runs = sealed_night["store"], sealed_night["runs"]
    report = report_of(store, "night")
    h = report.holdout
    assert h is not None and not h.sealed and h.holdout_metric == "holdout_bpb"
    rows = {row.label: row for row in h.rows}
    sweep = store.get_sweep("night")
    base = store.list_experiments(sweep.id)[0].commit
    for label, commit in (("baseline", base), ("best", sweep.best_commit)):
        mine = [r for r in runs if r.commit == commit and r.status is RunStatus.OK]
        assert rows[label].holdout == pytest.approx(
            sum(r.holdout for r in mine if r.holdout is not None) / len(mine))
        assert rows[label].holdout_n == len(mine) and rows[label].validation_n == len(mine)
    md = render_markdown(report)
    assert "## Validation vs holdout (`val_bpb` vs sealed `holdout_bpb`)" in md
    assert f"{rows['best'].holdout:.6f} (n={rows['best'].holdout_n})" in md
    assert f"{rows['baseline'].holdout:.6f}" in render_html(report)
