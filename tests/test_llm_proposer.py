"""The llm:<profile> proposer end to end: real Loop, real git, fake LLM servers on loopback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fake_llm import Error, FakeLLM
from foreground import run_sweep
from sqlalchemy import select

from agent.core.domain import ExperimentStatus as S
from agent.engine.loop import Loop, LoopSettings
from agent.executors.local import SubprocessRunner
from agent.git.repo import GitRepo, init_repo
from agent.ops.sweeps import create_sweep
from db.engine import open_database
from db.models import ExperimentRow
from db.store import SqlStore
from overnight.runtime import make_proposer

FIXTURE = Path(__file__).parent / "fixtures" / "fake_target"
KEY = "sk-test-0123456789-do-not-store"


def fenced(diff: str, desc: str) -> str:
    return f"DESCRIPTION: {desc}\n```diff\n{diff}```\n"


GOOD_LR = fenced("""--- a/train.py
+++ b/train.py
@@ -3,3 +3,3 @@
-LR = 0.01  # best at 0.04
+LR = 0.04  # best at 0.04
 WIDTH = 64  # best at 256
""", "raise the learning rate to 0.04")
NOT_APPLYING = fenced("""--- a/train.py
+++ b/train.py
@@ -10,2 +10,2 @@
-LR = 0.02
+LR = 0.03
""", "tweak the learning rate")
PROSE = "I think the model would benefit from a wider MLP and a warmup schedule."
SEARCH_REPLACE = """Widen the model.
DESCRIPTION: widen the model to 256

train.py
<<<<<<< SEARCH
WIDTH = 64  # best at 256
=======
WIDTH = 256  # best at 256
>>>>>>> REPLACE
"""
TYPO = fenced("""--- a/train.py
+++ b/train.py
@@ -12,1 +12,1 @@
-USE_TRICK = False  # True helps by 0.05
+USE_TRICK = Tru  # True helps by 0.05
""", "turn on the trick")
TYPO_FIX = fenced("""--- a/train.py
+++ b/train.py
@@ -12,1 +12,1 @@
-USE_TRICK = False  # True helps by 0.05
+USE_TRICK = True  # True helps by 0.05
""", "turn on the trick (fixed typo)")
LOWER_LR = fenced("""--- a/train.py
+++ b/train.py
@@ -10,1 +10,1 @@
-LR = 0.01  # best at 0.04
+LR = 0.005  # best at 0.04
""", "halve the learning rate")


@pytest.fixture
def target(tmp_path: Path) -> Path:
    path = tmp_path / "target"
    shutil.copytree(FIXTURE, path, ignore=shutil.ignore_patterns("__pycache__"))
    init_repo(path)
    return path


def write_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: FakeLLM,
                  **extra: object) -> Path:
    values: dict[str, object] = {"backend": fake.kind, "base_url": fake.base_url,
                                 "model": "fake-1", "api_key_env": "FAKE_LLM_KEY",
                                 "backoff_s": 0.01, "max_retries": 3, "timeout_s": 10, **extra}
    body = "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in values.items())
    cfg = tmp_path / "llm.toml"
    cfg.write_text("[profiles.fake]\n" + body)
    monkeypatch.setenv("OVERNIGHT_LLM_CONFIG", str(cfg))
    monkeypatch.setenv("FAKE_LLM_KEY", KEY)
    return cfg


def run_llm_sweep(tmp_path: Path, target: Path, max_experiments: int) -> tuple[SqlStore, int]:
    store = SqlStore(open_database(tmp_path / "db.sqlite"))
    repo = GitRepo(target)
    sweep = create_sweep(store, repo, target, name="llm", proposer="llm:fake",
                         max_experiments=max_experiments)
    loop = Loop(store, repo, SubprocessRunner(grace_s=1), LoopSettings(tmp_path / "work"),
                proposer=make_proposer(sweep.proposer, sweep.seed,
                                       config_path=tmp_path / "llm.toml"))
    run_sweep(loop, "llm")
    return store, sweep.id


def test_openai_loop_retries_rejects_and_repairs(tmp_path, target, monkeypatch):
    script = [Error(429, retry_after=0), GOOD_LR,  # 429 then success
              NOT_APPLYING, PROSE, SEARCH_REPLACE,  # two unusable answers, then s/r
              PROSE, PROSE, PROSE,  # stays unusable: recorded as rejected
              TYPO, TYPO_FIX]  # NameError (trivial crash), then the repair
    with FakeLLM("openai", script) as fake:
        write_profile(tmp_path, monkeypatch, fake)
        store, sweep_id = run_llm_sweep(tmp_path, target, max_experiments=5)
    assert fake.script == []
    exps = store.list_experiments(sweep_id)
    assert [e.status for e in exps] == [S.KEPT, S.KEPT, S.KEPT, S.REJECTED, S.CRASHED, S.KEPT]
    base, lr, width, rejected, typo, fix = exps
    assert lr.description == "raise the learning rate to 0.04" and lr.meta["llm_usage"][
        "http_retries"] == 1
    assert width.meta["answer_shape"] == "search_replace" and len(width.meta["llm_errors"]) == 2
    assert "does_not_apply" in width.meta["llm_errors"][0]
    assert rejected.meta["raw_answer"] == PROSE and len(rejected.meta["llm_errors"]) == 3
    assert rejected.proposer == "llm:fake"
    assert typo.crash_kind.value == "trivial" and "NameError" in (typo.reason or "")
    assert fix.parent_id == typo.id and fix.attempt == 1 and fix.metric == pytest.approx(0.95)
    # The model saw its errors, and the repair prompt carried the log tail.
    assert "could not be used" in fake.requests[3].last_user
    assert "does not match the file" in fake.requests[3].last_user
    assert "NameError" in fake.requests[-1].last_user and "Tru" in fake.requests[-1].last_user
    assert fake.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert all(r.path == "/v1/chat/completions" for r in fake.requests)
    # Tokens: 9 answered calls of 1000 in / 200 out (the 429 costs nothing).
    assert store.llm_usage(sweep_id)[:2] == (9_000, 1_800)
    assert KEY.encode() not in (tmp_path / "db.sqlite").read_bytes()


def test_anthropic_duplicate_accounting_and_cap(tmp_path, target, monkeypatch):
    script = [LOWER_LR, LOWER_LR, TYPO_FIX, GOOD_LR]
    with FakeLLM("anthropic", script) as fake:
        write_profile(tmp_path, monkeypatch, fake, usd_per_mtok_in=3.0, usd_per_mtok_out=15.0,
                      max_llm_tokens=4000, omit=["temperature"])
        store, sweep_id = run_llm_sweep(tmp_path, target, max_experiments=10)
    exps = store.list_experiments(sweep_id)
    assert [e.status for e in exps] == [S.KEPT, S.DISCARDED, S.KEPT, S.REJECTED]
    # The sweep says why it ended: the cap, recorded as the proposer's last word; a fourth
    # call (3600 spent + a ~1000-token prompt) would have passed it, so it was never made.
    assert "LLM token cap reached" in (exps[-1].reason or "") and exps[-1].diff == ""
    assert "already tried as experiment 2" in fake.requests[2].last_user
    assert fake.script == [GOOD_LR]  # the cap stopped the sweep before asking again
    assert store.get_sweep("llm").status.value == "done"
    assert all(r.path == "/v1/messages" and r.headers["x-api-key"] == KEY for r in fake.requests)
    assert fake.requests[0].body["system"].startswith("You are an ML research engineer")
    assert "temperature" not in fake.requests[0].body  # the profile's `omit`
    tokens_in, tokens_out, usd = store.llm_usage(sweep_id)
    assert (tokens_in, tokens_out) == (3000, 600) and usd == pytest.approx(0.018)
    with store.session("test") as s:
        per_exp = {r.id: (r.llm_tokens_in, r.llm_tokens_out, r.llm_usd)
                   for r in s.scalars(select(ExperimentRow).order_by(ExperimentRow.id))}
    assert per_exp[2] == (1000, 200, pytest.approx(0.006))
    assert per_exp[3] == (2000, 400, pytest.approx(0.012))
    assert KEY.encode() not in (tmp_path / "db.sqlite").read_bytes()


def test_a_server_that_stays_down_costs_one_proposal_not_the_night(tmp_path, target,
                                                                    monkeypatch):
    with FakeLLM("openai", [Error(503)] * 4 + [GOOD_LR]) as fake:
        write_profile(tmp_path, monkeypatch, fake, max_retries=3)
        store, sweep_id = run_llm_sweep(tmp_path, target, max_experiments=3)
    exps = store.list_experiments(sweep_id)
    # 1 try + 3 retries, then that proposal is rejected saying why, and the next one is asked
    assert [e.status for e in exps[:3]] == [S.KEPT, S.REJECTED, S.KEPT]
    assert all(r.path == "/v1/chat/completions" for r in fake.requests[:5])
    assert exps[1].reason.startswith("the model's server failed") and "503" in exps[1].reason
    assert "after 3 retries" in exps[1].reason and exps[1].meta["rejection"] == "server_error"
    assert exps[2].description == "raise the learning rate to 0.04"
    assert exps[1].meta["llm_usage"]["calls"] == 0  # the 503s cost nothing
    assert exps[2].meta["llm_usage"]["tokens_in"] == 1000


def test_client_error_is_not_retried(tmp_path, target, monkeypatch, caplog):
    with FakeLLM("openai", [Error(401, '{"error": "bad key"}'), GOOD_LR]) as fake:
        write_profile(tmp_path, monkeypatch, fake)
        with caplog.at_level("WARNING"):
            store, sweep_id = run_llm_sweep(tmp_path, target, max_experiments=2)
    assert len(fake.requests) == 1 and fake.script == [GOOD_LR]  # never asked again
    assert fake.requests[0].headers["authorization"] == f"Bearer {KEY}"
    # the sweep ends cleanly on the baseline, with the error logged once, readably, and
    # recorded as the reason it ended
    exps = store.list_experiments(sweep_id)
    assert [e.status for e in exps] == [S.KEPT, S.REJECTED]
    assert "HTTP 401" in (exps[1].reason or "") and "bad key" in exps[1].reason
    assert store.get_sweep("llm").status.value == "done"
    assert store.llm_usage(sweep_id)[:2] == (0, 0)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "HTTP 401" in errors[0] and "bad key" in errors[0], errors
    assert not any("retry" in r.getMessage() for r in caplog.records), caplog.text


def test_overnight_run_cli_with_llm_profile(tmp_path, target, monkeypatch):
    """The console script, unattended: `overnight run --proposer llm:fake` incl. a repair."""
    import os
    import subprocess
    import sys

    with FakeLLM("openai", [TYPO, TYPO_FIX]) as fake:
        cfg = write_profile(tmp_path, monkeypatch, fake)
        env = {k: v for k, v in os.environ.items() if k != "OVERNIGHT_LLM_CONFIG"}
        env["FAKE_LLM_KEY"] = KEY
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "overnight"), "run", "--target", str(target),
             "--experiments", "2", "--proposer", "llm:fake", "--sweep", "cli",
             "--llm-config", str(cfg),
             "--db", str(tmp_path / "cli.sqlite")],
            env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    store = SqlStore(open_database(tmp_path / "cli.sqlite"))
    exps = store.list_experiments(store.get_sweep("cli").id)
    assert [(e.status, e.parent_id) for e in exps] == [(S.KEPT, None), (S.CRASHED, None),
                                                       (S.KEPT, 2)]
    assert store.llm_usage(exps[0].sweep_id)[:2] == (2000, 400)


def _answer(old: str, new: str, desc: str, category: str, line: int) -> str:
    return (f"DESCRIPTION: {desc}\nCATEGORY: {category}\n```diff\n--- a/train.py\n+++ b/train.py\n"
            f"@@ -{line},1 +{line},1 @@\n-{old}\n+{new}\n```\n")


def test_prompt_carries_the_sweeps_digest_and_its_capped_categories(tmp_path, target,
                                                                   monkeypatch):
    toml = target / "overnight.toml"
    toml.write_text(toml.read_text() + "category_shares = { architecture = 0.25 }\n")
    init_repo(target, "cap architecture")
    script = [
        _answer("WIDTH = 64  # best at 256", "WIDTH = 256  # best at 256", "widen", "architecture",
                11),
        _answer("LR = 0.01  # best at 0.04", "LR = -0.01  # best at 0.04", "negative LR",
                "hyperparameter", 10),
        _answer("USE_TRICK = False  # True helps by 0.05", "USE_TRICK = True  # True helps by 0.05",
                "the trick", "architecture", 12),  # refused: architecture's share is used up
        _answer("LR = 0.01  # best at 0.04", "LR = 0.04  # best at 0.04", "raise the LR",
                "hyperparameter", 9),
    ]
    with FakeLLM("openai", script) as fake:
        write_profile(tmp_path, monkeypatch, fake)
        store, sweep_id = run_llm_sweep(tmp_path, target, max_experiments=4)
    exps = store.list_experiments(sweep_id)
    assert [e.status for e in exps[:4]] == [S.KEPT, S.KEPT, S.CRASHED, S.KEPT]
    assert [e.meta["category"] for e in exps[1:4]] == ["architecture", "hyperparameter",
                                                         "hyperparameter"]
    first, third = fake.requests[0].last_user, fake.requests[2].last_user
    assert "<insights>" in first and "nothing kept yet" in first
    digest = third.split("<insights>")[1].split("</insights>")[0]
    assert "Crash lessons" in digest and "LR ≤ -0.01: crash (#3)" in digest
    assert "WIDTH [architecture] now 256; 1 runs" in digest
    assert "architecture: 1 of 1 allowed (25% of 4 experiments)" in third
    assert "architecture category has used its share" in fake.requests[3].last_user
