"""One projection of an experiment: REST, the MCP tools and `results --format json` show the
same fields with the same values (agent.analysis.projection.ExperimentView)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from browser_helpers import make_app
from fastapi.testclient import TestClient

from agent.analysis.projection import ExperimentView
from api.mcp.tools import AgentTools
from overnight.runtime import Runtime

OVERNIGHT = str(Path(sys.executable).parent / "overnight")
FIELDS = set(ExperimentView.model_fields)


def _cli(*args: str) -> str:
    proc = subprocess.run([OVERNIGHT, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_rest_mcp_and_the_json_results_show_one_projection(tmp_path: Path, target: Path):
    db = tmp_path / "o.db"
    _cli("run", "--target", str(target), "--experiments", "2", "--db", str(db),
         "--sweep", "p")
    from_cli = json.loads(_cli("results", "--sweep", "p", "--format", "json", "--db", str(db)))
    rows = {r["id"]: r for r in from_cli["experiments"]}
    tools = AgentTools(Runtime(db).service)
    listed = {e.id: e.model_dump(mode="json") for e in tools.list_experiments("p").data}
    with TestClient(make_app(db)) as client:
        page = client.get("/experiments", params={"sweep": "p"}).json()["data"]
        one = {e["id"]: client.get(f"/experiments/{e['id']}").json() for e in page}
    rest = {e["id"]: e for e in page}
    assert len(rows) == 3 and rows.keys() == listed.keys() == rest.keys()
    for exp_id, mcp in listed.items():
        assert FIELDS <= set(mcp) and FIELDS <= set(rest[exp_id]) and FIELDS <= set(rows[exp_id])
        for field in FIELDS - {"diff", "run_records"}:
            assert mcp[field] == rest[exp_id][field] == rows[exp_id][field], (exp_id, field)
        assert mcp["diff"] is None and rest[exp_id]["diff"] is None
        assert one[exp_id]["diff"] is not None  # the one experiment asked for carries its diff
        # ... and its runs, as results json lists them; lists stay light
        assert mcp["run_records"] is None and rest[exp_id]["run_records"] is None
        assert one[exp_id]["run_records"] == rows[exp_id]["run_records"]
        assert rows[exp_id]["run_records"], exp_id
    result = tools.experiment_result(max(listed)).model_dump(mode="json")
    no_runs = FIELDS - {"run_records"}
    assert {f: result[f] for f in no_runs} == {f: listed[max(listed)][f] for f in no_runs}
    assert result["run_records"] == rows[max(listed)]["run_records"]
    assert result["finished"] is True and "waited_s" in result
