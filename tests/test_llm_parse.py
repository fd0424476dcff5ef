"""Answer parsing, prompts and profiles of the LLM proposer (pure parts, no HTTP)."""

from __future__ import annotations

import pytest

from agent.core.errors import AdmissionError, ConfigError
from agent.proposers.llm import parse_answer
from agent.proposers.llm_backends import load_profile, parse_profile

FILE = "import os\n\nLR = 0.01\nWIDTH = 64\n\n\ndef main():\n    print(LR * WIDTH)\n"
FILES = {"train.py": FILE}


def test_unified_diff_with_wrong_line_numbers_is_reanchored():
    answer = ("Description: double the width\n```diff\n--- a/train.py\n+++ b/train.py\n"
              "@@ -40,2 +40,2 @@\n LR = 0.01\n-WIDTH = 64\n+WIDTH = 128\n```\n")
    parsed = parse_answer(answer, FILES)
    assert parsed.description == "double the width" and parsed.shape == "unified_diff"
    assert "+WIDTH = 128" in parsed.diff and parsed.diff.startswith("--- a/train.py")


def test_search_replace_and_full_file():
    sr = ("DESCRIPTION: lr up\ntrain.py\n<<<<<<< SEARCH\nLR = 0.01   \n=======\nLR = 0.02\n"
          ">>>>>>> REPLACE\n")
    assert "+LR = 0.02" in parse_answer(sr, FILES).diff
    whole = "DESCRIPTION: print more\n```python train.py\n" + FILE.replace(
        "print(LR * WIDTH)", "print(LR, WIDTH)") + "```\n"
    parsed = parse_answer(whole, FILES)
    assert parsed.shape == "full_file" and "+    print(LR, WIDTH)" in parsed.diff


@pytest.mark.parametrize(("answer", "code"), [
    ("Let's try a better optimizer.", "no_diff"),
    ("x\ntrain.py\n<<<<<<< SEARCH\nLR = 0.5\n=======\nLR = 1\n>>>>>>> REPLACE\n", "bad_search"),
    ("x\ntrain.py\n<<<<<<< SEARCH\n\n\n=======\nLR = 1\n>>>>>>> REPLACE\n", "bad_search"),
    ("```diff\n--- a/prepare.py\n+++ b/prepare.py\n@@ -1 +1 @@\n-a\n+b\n```", "not_editable"),
    ("DESCRIPTION: same\n```python train.py\n" + FILE + "```", "empty_diff"),
])
def test_unusable_answers_name_the_problem(answer, code):
    with pytest.raises(AdmissionError) as err:
        parse_answer(answer, FILES)
    assert err.value.code == code


def test_profiles_never_hold_keys(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="environment variable"):
        parse_profile("p", {"model": "m", "api_key": "sk-x"})
    cfg = tmp_path / "llm.toml"
    cfg.write_text('[profiles.local]\nbase_url = "http://127.0.0.1:1/v1"\nmodel = "qwen"\n'
                   'api_key_env = ""\n[profiles.hosted]\nbackend = "anthropic"\nmodel = "c"\n')
    assert load_profile("local", cfg).api_key() is None
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    hosted = load_profile("hosted", cfg)
    assert hosted.base_url == "https://api.anthropic.com"
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY is not set"):
        hosted.api_key()
    with pytest.raises(ConfigError, match="no \\[profiles.nope\\]"):
        load_profile("nope", cfg)


def test_history_table_keeps_kept_and_recent_within_budget():
    from dataclasses import replace as dc_replace
    from datetime import UTC, datetime

    from agent.core.config import TargetConfig
    from agent.core.domain import Experiment, ExperimentStatus, Sweep, SweepStatus
    from agent.proposers.llm import estimate_tokens, history_table

    sweep = Sweep(1, "s", "/t", "overnight/s", SweepStatus.RUNNING, "llm:x",
                  TargetConfig(command="python train.py", editable=("train.py",),
                               metric="val_bpb", budget_s=1, timeout_s=5),
                  None, 1.3, 1.1, "c", 2, datetime.now(UTC))
    base = Experiment(1, 1, ExperimentStatus.KEPT, "baseline", "", "baseline", metric=1.3)
    hist = [base, dc_replace(base, id=2, description="kept idea", metric=1.1, best_before=1.3)]
    hist += [dc_replace(base, id=i, status=ExperimentStatus.DISCARDED, description=f"idea {i}",
                        metric=1.2, best_before=1.1) for i in range(3, 200)]
    table = history_table(sweep, hist, budget_tokens=400)
    assert estimate_tokens(table) < 480
    assert "kept idea" in table and "idea 199" in table and "idea 3 " not in table
    assert "older experiments not shown" in table


@pytest.mark.parametrize("table, key", [
    ({"model": "m", "temperature": "hot"}, "temperature"),
    ({"model": "m", "max_retries": -1}, "max_retries"),
    ({"model": "m", "max_retries": True}, "max_retries"),
    ({"model": "m", "backend": "gemini"}, "backend"),
    ({"model": "m", "base_url": "ftp://x"}, "base_url"),
    ({"model": "m", "colour": 1}, "colour"),
    ({"model": " "}, "model"),
    ({}, "model"),
])
def test_bad_profiles_name_the_key(table, key):
    with pytest.raises(ConfigError) as exc:
        parse_profile("p", table, source="llm.toml")
    assert key in str(exc.value) and "llm.toml [profiles.p]" in str(exc.value)


def test_profile_defaults_follow_the_backend():
    p = parse_profile("p", {"model": "m", "backend": "anthropic", "max_llm_usd": 2})
    assert (p.base_url, p.api_key_env, p.max_llm_usd) == (
        "https://api.anthropic.com", "ANTHROPIC_API_KEY", 2.0)
    local = parse_profile("l", {"model": "m", "base_url": "http://127.0.0.1:8/v1/"})
    assert local.base_url == "http://127.0.0.1:8/v1" and local.api_key_env == "OPENAI_API_KEY"


LONG = "".join(f"X{i} = {i}  # a constant\n" for i in range(41))  # a 41-line file


@pytest.mark.parametrize("label", ["```python train.py", "```python"])
def test_a_fragment_is_never_taken_for_the_whole_file(label):
    """A 21-line block of invented Python was once refused only for being under 60 % of a
    41-line file: any block that drops most of the file is refused, labelled or not."""
    files = {"train.py": LONG}
    fragment = "".join(f"Y{i} = {i}\n" for i in range(21))
    with pytest.raises(AdmissionError) as err:
        parse_answer(f"DESCRIPTION: new\n{label}\n{fragment}```\n", files)
    assert err.value.code == "not_whole_file" and "keeps only 0 of the file's 41" in str(
        err.value.message)
    mostly = LONG.replace("X40 = 40", "X40 = 41").replace("X3 = 3", "X3 = 4")
    parsed = parse_answer(f"DESCRIPTION: two\n{label}\n{mostly}```\n", files)
    assert parsed.shape == "full_file" and "+X40 = 41" in parsed.diff


def test_the_json_edit_replaces_whole_lines_and_keeps_the_indentation():
    import json

    edit = {"description": "print both", "category": "simplification",
            "edits": [{"path": "train.py", "search": "    print(LR * WIDTH)",
                       "replace": "print(LR, WIDTH)"}]}
    parsed = parse_answer(json.dumps(edit), FILES)
    assert parsed.shape == "json_edit" and parsed.category == "simplification"
    assert "+    print(LR, WIDTH)" in parsed.diff and parsed.description == "print both"
    fenced = "```json\n" + json.dumps({**edit, "edits": [{"path": "train.py", "search": "LR = 9",
                                                         "replace": "LR = 1"}]}) + "\n```"
    with pytest.raises(AdmissionError, match="'LR = 9' was not found") as err:
        parse_answer(fenced, FILES)
    assert err.value.code == "bad_search"
    same = {**edit, "edits": [{"path": "train.py", "search": "LR = 0.01", "replace": "LR = 0.01"}]}
    with pytest.raises(AdmissionError) as err:
        parse_answer(json.dumps(same), FILES)
    assert err.value.code == "empty_diff"


def test_the_schema_offers_only_lines_that_exist_once():
    from agent.proposers.llm_backends import edit_schema

    files = {"train.py": 'x = 1\n\nx = 1\ny = 2\nprint("hi")\n'}
    search = edit_schema(files)["properties"]["edits"]["items"]["properties"]["search"]
    assert search["enum"] == ["y = 2"]  # blank, repeated and quoted lines are left out


def test_length_errors_name_the_context_and_the_meter_learns():
    from agent.proposers.llm_backends import TokenMeter, context_in_error, history_budget

    assert context_in_error("This model's maximum context length is 8192 tokens. However, "
                            "you requested 8268 tokens") == 8192
    assert context_in_error("Requested tokens (9000) exceed context window of 4096") == 4096
    assert context_in_error('{"n_prompt_tokens": 9000, "n_ctx": 2048}') == 2048
    meter = TokenMeter()
    msgs = [{"role": "user", "content": "a" * 3000}]
    meter.observe("", msgs, 1000 + 16)  # the server counted 1000 tokens of text
    assert meter.chars_per_token == pytest.approx(3.0) and meter.messages("", msgs) == 1016
    assert history_budget(None, 5000, 3000, 4096) == 3000  # context unknown: the profile's
    assert history_budget(8192, 5000, 3000, 4096) == 8192 - 245 - 5000 - 2048
    with pytest.raises(Exception, match="leaves no room"):
        history_budget(8192, 7900, 3000, 4096)


def test_json_edits_are_placed_in_the_file_as_shown():
    import json

    two = {"description": "d", "category": "hyperparameter", "edits": [
        {"path": "train.py", "search": "LR = 0.01", "replace": "LR = 0.02"},
        {"path": "train.py", "search": "WIDTH = 64", "replace": "WIDTH = 128\nDEPTH = 2"}]}
    parsed = parse_answer(json.dumps(two) + '\n{\n  " } ]}', FILES)  # junk after the object
    assert "+LR = 0.02" in parsed.diff and "+DEPTH = 2" in parsed.diff
    raw_newline = json.dumps(two).replace("\\n", "\n")  # a grammar lets raw newlines through
    assert parse_answer(raw_newline, FILES).diff == parsed.diff
    twice = {**two, "edits": [two["edits"][0], two["edits"][0]]}
    assert "+LR = 0.02" in parse_answer(json.dumps(twice), FILES).diff
    same = {**two, "edits": [two["edits"][0], {**two["edits"][0], "replace": "LR = 0.3"}]}
    with pytest.raises(AdmissionError, match="edits 1 and 2 change the same line"):
        parse_answer(json.dumps(same), FILES)
