"""schemathesis (every check: no server errors, status codes, content types, schemas, Allow
headers, positive/negative data) against the real server over loopback, ≥ 1,000 cases."""

from __future__ import annotations

from pathlib import Path

import pytest
from api_probes import run_schemathesis
from service_fixtures import ServerProcess, make_counting_target

pytestmark = pytest.mark.slow


def test_schemathesis_finds_no_server_error_and_no_nonconformance(tmp_path: Path) -> None:
    target = make_counting_target(tmp_path / "target", n_knobs=4)
    server = ServerProcess(tmp_path / "o.db", log=tmp_path / "server.log", slots=0).start()
    try:
        with server.client() as c:  # a real sweep "s" (the config names it) with experiment 1
            r = c.post("/sweeps", json={"name": "s", "target": str(target), "paused": True,
                                        "proposer": "queue"})
            assert r.status_code == 201, r.text
        result = run_schemathesis(server.url, tmp_path)
    finally:
        server.stop()
    assert result["cases"] >= 1000, result["output"][-3000:]
    assert result["returncode"] == 0 and result["failures"] == 0, result["output"][-6000:]
    assert "Traceback" not in server.tail(10_000_000), server.tail()
