"""The LLM proposer against a real small model (SmolLM2-135M on llama-cpp-python's server,
tests/real_llm.py): a short sweep through `overnight run --proposer llm:<profile>`, end to end.

A 135M model proposes poorly; what is tested is that the service treats a real server
honestly: the night is not ended by one bad answer, every row's reason is what happened, every
token is counted, and neither the context nor the caps are passed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import real_llm

from agent.core.domain import RAN_STATUSES, CrashKind
from agent.core.domain import ExperimentStatus as S
from agent.engine.attempt import MAX_REPAIRS
from agent.git.repo import init_repo
from db.engine import open_database
from db.store import SqlStore

pytestmark = [pytest.mark.real_llm, pytest.mark.slow]
FIXTURE = Path(__file__).parent / "fixtures" / "fake_target"
EXPERIMENTS = 5
MAX_TOKENS = 14_000  # per sweep: ~4 asks of ~2,000 tokens each get through, then the cap


@pytest.fixture(scope="module")
def smollm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    why = real_llm.missing()
    if os.environ.get("OVERNIGHT_REQUIRE_REAL_LLM") == "1":
        if why:
            pytest.fail(f"OVERNIGHT_REQUIRE_REAL_LLM=1 but {why}")
    elif os.environ.get("OVERNIGHT_SKIP_REAL_LLM") == "1":
        pytest.skip("OVERNIGHT_SKIP_REAL_LLM=1")
    elif why:
        pytest.skip(why)
    with real_llm.llama_server(tmp_path_factory.mktemp("llama") / "server.log") as base:
        yield base


def _profile(tmp_path: Path, base_url: str) -> Path:
    cfg = tmp_path / "llm.toml"
    cfg.write_text(f'[profiles.smol]\nbase_url = "{base_url}"\nmodel = "smollm2"\n'
                   f'api_key_env = ""\ncontext_tokens = {real_llm.CONTEXT_TOKENS}\n'
                   f"max_llm_tokens = {MAX_TOKENS}\ntimeout_s = 600\n")
    return cfg


@pytest.mark.timeout(1800)
def test_a_short_sweep_against_a_real_model(smollm: str, tmp_path: Path) -> None:
    target = tmp_path / "target"
    shutil.copytree(FIXTURE, target, ignore=shutil.ignore_patterns("__pycache__"))
    init_repo(target)
    db = tmp_path / "o.sqlite"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "overnight"), "run", "--target", str(target),
         "--experiments", str(EXPERIMENTS), "--proposer", "llm:smol", "--sweep", "smol",
         "--llm-config", str(_profile(tmp_path, smollm)), "--db", str(db)],
        capture_output=True, text=True, timeout=1700)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    store = SqlStore(open_database(db))
    sweep = store.get_sweep("smol")
    exps = store.list_experiments(sweep.id)
    llm = [e for e in exps if not e.is_baseline]
    assert sweep.status.value == "done" and llm

    # The night did not end early: every experiment was used, or the last row is the cap.
    used = [e for e in llm if e.status is not S.QUEUED]
    capped = "LLM token cap reached" in (llm[-1].reason or "")
    assert len(used) >= EXPERIMENTS or capped, [(e.status, e.reason) for e in llm]
    # The cap counts proposals; a repair of a trivial crash continues its proposal (parent_id)
    # and runs even once the cap is reached, at most MAX_REPAIRS deep.
    ran = [e for e in llm if e.status in RAN_STATUSES]
    assert len([e for e in ran if e.parent_id is None]) <= EXPERIMENTS, ran
    repairs = [e for e in ran if e.parent_id is not None]
    assert all(0 < e.attempt <= MAX_REPAIRS for e in repairs), repairs
    by_id = {e.id: e for e in llm}
    assert all(by_id[e.parent_id].crash_kind is CrashKind.TRIVIAL for e in repairs
               if e.parent_id is not None), repairs

    # Every row's reason is what happened.
    for e in llm:
        conv = e.meta.get("llm_conversation", [])
        if e.status is S.REJECTED and "unusable" in e.meta:
            bad = e.meta["unusable"]
            assert e.reason == bad["message"] and e.meta["rejection"] == bad["code"]
            answers = [t for t in conv if "answer" in t]
            assert all("error" in t for t in answers), conv  # none was usable
            last = conv[-1]["error"].split(": ", 1)[1]
            assert last[:60] in e.reason, (e.reason, conv[-1])
        elif e.status is S.REJECTED and e.description != "the proposer has nothing to propose":
            assert conv and "error" not in conv[-1]  # the model's answer, refused by admission
        elif e.status in (S.KEPT, S.DISCARDED):
            assert e.metric is not None and "error" not in conv[-1]
            assert e.meta["answer_shape"] == "json_edit"
        # the context was never passed: each ask's prompt + its answer budget fit in it
        for t in conv:
            if "tokens_in" in t:
                assert t["tokens_in"] + t["max_tokens"] <= real_llm.CONTEXT_TOKENS, t
                assert t["format"] != "text"  # the server took a schema

    # Every token is counted, and the cap held.
    tokens_in, tokens_out, _ = store.llm_usage(sweep.id)
    per_exp = [e.meta["llm_usage"] for e in llm if "llm_usage" in e.meta]
    # (0 when the server died: each row's reason then says "connection error")
    assert tokens_in == sum(u["tokens_in"] for u in per_exp) > 0, [e.reason for e in llm]
    assert tokens_out == sum(u["tokens_out"] for u in per_exp) > 0
    for e in llm:
        turns = [t for t in e.meta.get("llm_conversation", []) if "tokens_in" in t]
        if turns:
            assert sum(t["tokens_in"] for t in turns) == e.meta["llm_usage"]["tokens_in"]
    assert tokens_in + tokens_out <= MAX_TOKENS
    # and the model gave at least one well-formed edit that admission, not parsing, judged
    judged = [e for e in llm if e.status is not S.REJECTED or "unusable" not in e.meta]
    assert any(e.meta.get("answer_shape") == "json_edit" for e in judged), (
        [(e.status, e.reason) for e in llm])
