"""Answer parsing, prompts and profiles of the LLM proposer (pure parts, no HTTP)."""

from __future__ import annotations

import pytest

from agent.core.errors import AdmissionError, ConfigError
from agent.proposers.llm_config import load_profile, parse_profile
from agent.proposers.llm_parse import parse_answer

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
    from agent.proposers.llm_prompt import estimate_tokens, history_table

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
