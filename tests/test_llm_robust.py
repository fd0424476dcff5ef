"""The LLM proposer against what real servers do: context refusals, answer formats they do or
do not take, timeouts, re-asks, caps, and the records that show it (real Loop, real git, fake
servers on loopback)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fake_llm import Error, FakeLLM, Slow, Tool
from fastapi.testclient import TestClient
from test_llm_proposer import FIXTURE, GOOD_LR, PROSE, run_llm_sweep, write_profile

from agent.analysis.projection import ExperimentView
from agent.core.domain import ExperimentStatus as S
from agent.git.repo import init_repo

# The JSON edit a schema-bound server returns: one line of train.py, replaced.
EDIT = {"description": "raise the learning rate to 0.04", "category": "hyperparameter",
        "edits": [{"path": "train.py", "search": "LR = 0.01  # best at 0.04",
                   "replace": "LR = 0.04  # best at 0.04"}]}
WIDEN = {"description": "widen to 256", "category": "architecture",
         "edits": [{"path": "train.py", "search": "WIDTH = 64  # best at 256",
                    "replace": "WIDTH = 256  # best at 256"}]}
LENGTH_400 = Error(400, json.dumps({"error": {
    "message": "This model's maximum context length is 2048 tokens. However, you requested "
               "4800 tokens (704 in the messages, 4096 in the completion).",
    "type": "invalid_request_error", "code": "context_length_exceeded"}}))
FORMAT_422 = Error(422, json.dumps({"detail": [{
    "type": "literal_error", "loc": ["body", "response_format", "type"],
    "msg": "Input should be 'text' or 'json_object'", "input": "json_schema"}]}))
# What llama-cpp-python 0.3.36's server answered to response_format json_schema (a 500)
FORMAT_500 = Error(500, json.dumps({"error": {
    "message": "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', "
               "'response_format', 'type'), 'msg': \"Input should be 'text' or 'json_object'\", "
               "'input': 'json_schema'}", "type": "internal_server_error"}}))


@pytest.fixture
def target(tmp_path: Path) -> Path:
    path = tmp_path / "target"
    shutil.copytree(FIXTURE, path, ignore=shutil.ignore_patterns("__pycache__"))
    init_repo(path)
    return path


def test_a_prompt_the_context_refuses_is_shrunk_and_asked_again(tmp_path, target, monkeypatch):
    with FakeLLM("openai", [LENGTH_400, json.dumps(EDIT)]) as fake:
        write_profile(tmp_path, monkeypatch, fake, answer_format="json_object")
        store, sweep_id = run_llm_sweep(tmp_path, target, max_experiments=1)
    exps = store.list_experiments(sweep_id)
    assert [e.status for e in exps] == [S.KEPT, S.KEPT]
    first, second = fake.requests[0].body, fake.requests[1].body
    assert first["max_tokens"] == 4096  # the context was not known yet
    assert second["max_tokens"] < 2048 - 600  # learned from the refusal, the prompt fits
    turns = exps[1].meta["llm_conversation"]
    assert turns[0]["error"].startswith("length: ") and "maximum context length" in turns[0][
        "error"]
    assert turns[1]["answer"] == json.dumps(EDIT) and "error" not in turns[1]
    assert exps[1].meta["answer_shape"] == "json_edit"


def test_a_context_that_keeps_refusing_costs_one_proposal(tmp_path, target, monkeypatch):
    with FakeLLM("openai", [LENGTH_400] * 3 + [json.dumps(EDIT)]) as fake:
        write_profile(tmp_path, monkeypatch, fake, answer_format="json_object")
        store, sweep_id = run_llm_sweep(tmp_path, target, max_experiments=2)
    exps = store.list_experiments(sweep_id)
    assert [e.status for e in exps[:3]] == [S.KEPT, S.REJECTED, S.KEPT]
    rejected = exps[1]
    assert rejected.meta["rejection"] == "prompt_too_long"
    assert "context refused the prompt 3 times" in rejected.reason
    assert len(fake.requests) == 4 and store.get_sweep("llm").status.value == "done"


@pytest.mark.parametrize("refusal", [FORMAT_422, FORMAT_500])
def test_answer_formats_fall_back_until_the_server_takes_one(tmp_path, target, monkeypatch,
                                                            refusal):
    """OpenAI's json_schema refused (llama-cpp-python knows only json_object): json_object
    with the schema is asked next, and kept for the rest of the sweep; a refusal is never
    retried as if the server were down."""
    with FakeLLM("openai", [refusal, json.dumps(EDIT), json.dumps(WIDEN)]) as fake:
        write_profile(tmp_path, monkeypatch, fake)
        store, sweep_id = run_llm_sweep(tmp_path, target, max_experiments=2)
    bodies = [r.body for r in fake.requests[:3]]
    assert [b["response_format"]["type"] for b in bodies] == ["json_schema", "json_object",
                                                              "json_object"]
    schema = bodies[1]["response_format"]["schema"]
    lines = schema["properties"]["edits"]["items"]["properties"]["search"]["enum"]
    assert lines[:3] == ["import os", "import sys", "import time"]  # no '"' lines (see why)
    assert "LR = 0.01  # best at 0.04" in lines and "    print(\"FAIL\")" not in lines
    assert "JSON object" in bodies[1]["messages"][0]["content"]
    exps = store.list_experiments(sweep_id)
    assert [e.status for e in exps[:3]] == [S.KEPT, S.KEPT, S.KEPT]
    assert exps[1].meta["llm_usage"]["calls"] == 1  # the refused format cost no answer


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_forced_tool_call_carries_the_edit(tmp_path, target, monkeypatch, kind):
    with FakeLLM(kind, [Tool(EDIT)]) as fake:
        write_profile(tmp_path, monkeypatch, fake, answer_format="tools")
        store, sweep_id = run_llm_sweep(tmp_path, target, max_experiments=1)
    body = fake.requests[0].body
    if kind == "openai":
        assert body["tool_choice"]["function"]["name"] == "propose_experiment"
        assert body["tools"][0]["function"]["parameters"]["required"] == [
            "description", "category", "edits"]
    else:
        assert body["tool_choice"] == {"type": "tool", "name": "propose_experiment"}
        assert "input_schema" in body["tools"][0]
    exp = store.list_experiments(sweep_id)[1]
    assert exp.status is S.KEPT and exp.description == EDIT["description"]
    assert exp.meta["category"] == "hyperparameter"


def test_a_timeout_is_not_asked_again_and_its_tokens_count(tmp_path, target, monkeypatch):
    with FakeLLM("openai", [Slow(3, GOOD_LR), GOOD_LR]) as fake:
        write_profile(tmp_path, monkeypatch, fake, timeout_s=0.5, answer_format="text",
                      max_output_tokens=300)
        store, sweep_id = run_llm_sweep(tmp_path, target, max_experiments=2)
    exps = store.list_experiments(sweep_id)
    assert [e.status for e in exps[:3]] == [S.KEPT, S.REJECTED, S.KEPT]
    timed_out = exps[1]
    assert timed_out.meta["rejection"] == "timeout" and "timeout_s=0.5" in timed_out.reason
    assert "not asked again" in timed_out.reason
    usage = timed_out.meta["llm_usage"]
    assert usage["estimated"] and usage["tokens_out"] == 300 and usage["tokens_in"] > 0
    assert len(fake.requests) == 2  # the abandoned call was never repeated
    tokens_in, tokens_out, _ = store.llm_usage(sweep_id)
    assert tokens_out == 300 + 200 and tokens_in == usage["tokens_in"] + 1000


def test_a_reask_carries_only_the_last_answer_and_what_was_wrong(tmp_path, target, monkeypatch):
    first = "I would tune the learning rate."
    with FakeLLM("openai", [first, PROSE, GOOD_LR]) as fake:
        write_profile(tmp_path, monkeypatch, fake, answer_format="text")
        store, sweep_id = run_llm_sweep(tmp_path, target, max_experiments=1)
    third = fake.requests[2].body["messages"]
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user"]
    assert third[2]["content"] == PROSE and not any(first in m["content"] for m in third)
    assert "could not be used: no change found" in third[3]["content"]
    exp = store.list_experiments(sweep_id)[1]
    assert exp.status is S.KEPT and len(exp.meta["llm_conversation"]) == 3


def test_records_show_the_conversation_everywhere(tmp_path, target, monkeypatch):
    """A rejected proposal's answers, errors and tokens: in the projection (REST, MCP,
    results json), in the sweep's spend, and on the dashboard's experiment page."""
    from browser_helpers import make_app

    with FakeLLM("openai", [PROSE, PROSE, PROSE, GOOD_LR]) as fake:
        write_profile(tmp_path, monkeypatch, fake, answer_format="text")
        store, sweep_id = run_llm_sweep(tmp_path, target, max_experiments=2)
    exps = store.list_experiments(sweep_id)
    rejected = exps[1]
    assert rejected.status is S.REJECTED and rejected.meta["rejection"] == "no_diff"
    assert rejected.reason.startswith("the model gave no usable change in 3 answers; the last: "
                                      "no change found in the answer")
    view = ExperimentView.of(rejected, "llm", with_diff=True).llm
    assert view is not None and view.rejection == rejected.reason
    assert [t.answer for t in view.conversation] == [PROSE] * 3 and len(view.errors) == 3
    assert (view.tokens_in, view.tokens_out, view.calls) == (3000, 600, 3)
    assert ExperimentView.of(exps[0], "llm").llm is None  # the baseline is nobody's answer
    listed = ExperimentView.of(rejected, "llm")  # in a list: the totals, not the answers
    assert listed.llm is not None and listed.llm.conversation == [] and listed.llm.calls == 3
    assert "llm_conversation" not in listed.meta

    out = subprocess.run([str(Path(sys.executable).parent / "overnight"), "results", "--sweep",
                          "llm", "--format", "json", "--db", str(tmp_path / "db.sqlite")],
                         capture_output=True, text=True, timeout=120)
    data = json.loads(out.stdout)
    assert data["llm"] == {"tokens_in": 4000, "tokens_out": 800, "usd": 0.0}
    row = next(r for r in data["experiments"] if r["id"] == rejected.id)
    assert row["llm"]["conversation"][2]["error"].startswith("no_diff: ")

    with TestClient(make_app(tmp_path / "db.sqlite")) as client:
        html = client.get(f"/ui/experiments/{rejected.id}").text
        rest = client.get(f"/experiments/{rejected.id}").json()
        sweep = client.get("/sweeps/llm").json()
    assert "Conversation with fake-1" in html and "What the model did wrong" in html
    assert html.count("Not usable:") == 3 and "wider MLP and a warmup schedule" in html
    assert rest["llm"]["rejection"] == rejected.reason and sweep["llm"]["tokens_in"] == 4000


def test_a_model_with_no_usable_idea_ends_the_night_saying_so(tmp_path, target, monkeypatch):
    with FakeLLM("openai", []) as fake:  # every answer: "I have no further ideas."
        write_profile(tmp_path, monkeypatch, fake, answer_format="text", answer_retries=0)
        store, sweep_id = run_llm_sweep(tmp_path, target, max_experiments=10)
    exps = store.list_experiments(sweep_id)
    assert [e.status for e in exps] == [S.KEPT] + [S.REJECTED] * 6
    assert all(e.meta["rejection"] == "no_diff" for e in exps[1:6])
    assert exps[-1].reason == ("5 proposals in a row were refused: the proposer counts as out "
                               "of ideas")
    assert store.get_sweep("llm").status.value == "done" and len(fake.requests) == 5


def test_a_cap_reached_mid_conversation_keeps_its_answers_and_ends_the_night(tmp_path, target,
                                                                           monkeypatch):
    with FakeLLM("openai", [PROSE, GOOD_LR]) as fake:  # 1000 tokens in, 200 out per answer
        write_profile(tmp_path, monkeypatch, fake, answer_format="text", max_llm_tokens=2500)
        store, sweep_id = run_llm_sweep(tmp_path, target, max_experiments=5)
    exps = store.list_experiments(sweep_id)
    assert [e.status for e in exps] == [S.KEPT, S.REJECTED, S.REJECTED]
    talked, last = exps[1], exps[2]
    assert talked.reason.startswith("the model gave no usable change in 1 answer; the last: "
                                    "no change found")
    assert "not asked again: LLM token cap reached" in talked.reason
    assert talked.meta["llm_conversation"][0]["answer"] == PROSE
    assert "LLM token cap reached" in last.reason and len(fake.requests) == 1
    assert store.llm_usage(sweep_id)[:2] == (1000, 200)  # within the cap, and all counted
