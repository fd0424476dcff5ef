"""The documents cannot rot: every command, key, route, tool, path and link in README.md and
docs/*.md is checked against the real code, and the README's tour is run end to end.

Static checks go through the real CLI's click command (each `overnight …` command in a bash
block is parsed exactly as the CLI would parse it, without running it), the real overnight.toml
and LLM-profile loaders, and the real routers. The tour runs as a user would type it, in a
scratch folder with its own HOME, against tiny fake trainers at the paths the README names.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import docs_check as dc
import pytest
from conftest import FIXTURES, commit_all

from agent.core.config import TargetConfig
from agent.git.repo import init_repo
from agent.proposers.llm_backends import LLMProfile

README = dc.ROOT / "README.md"
DOCS = dc.ROOT / "docs"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def group() -> Any:
    return dc.cli()


def test_the_readme_is_short_and_opens_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.encode()) <= 12 * 1024, f"README.md is {len(text.encode())} bytes"
    first = dc.blocks(README)[0]
    assert text.startswith("# overnight\n\n```bash\n") and first.lang == "bash"
    assert [c[:2] for c in dc.commands(first.text)] == [["./dev.sh", "demo"], ["./dev.sh", "test"]]


def test_every_command_in_a_bash_block_parses_as_the_cli_parses_it(group):
    assert dc.check_shell_blocks(group) == []


def test_every_command_in_the_prose_names_real_flags(group):
    assert dc.check_inline_commands(group) == []


def test_every_toml_block_loads_through_the_real_loader(tmp_path, group):
    assert dc.check_toml_blocks(tmp_path, group) == []


def test_the_tour_shows_the_gpt_templates_own_overnight_toml():
    import tomllib

    shown = next(b for b in dc.blocks(README) if b.lang == "toml")
    template = dc.ROOT / "experiments" / "gpt" / "overnight.toml"
    assert tomllib.loads(shown.text) == tomllib.loads(template.read_text())


def test_every_overnight_toml_key_is_documented_with_its_default():
    minimal = {"command": "python x.py", "editable": ["x.py"], "metric": "m", "budget_s": 300}
    required = {"command", "editable", "metric", "budget_s"}
    assert dc.check_key_table(DOCS / "target.md", TargetConfig, minimal, required) == []


def test_every_track_key_is_documented_with_its_default():
    from agent.core.tracking import TrackTable

    assert dc.check_key_table(DOCS / "tracking.md", TrackTable, {"to": "mlflow"}, {"to"},
                              header="`[track]` key") == []


def test_every_llm_profile_key_is_documented_with_its_default():
    assert (
        dc.check_key_table(
            DOCS / "llm-and-mcp.md", LLMProfile, {"name": "x", "model": "m"}, {"model"}
        )
        == []
    )


def test_the_route_table_is_the_api():
    documented = set()
    for row in dc.table(DOCS / "service.md", "route"):
        method, path = dc.code_of(row[0]).split()  # type: ignore[union-attr]
        documented.add((method, path))
    assert documented == set(dc.api_routes())


def test_every_dashboard_page_documented_exists():
    paths = dc.dashboard_paths()
    for row in dc.table(DOCS / "dashboard.md", "page"):
        for path in re.findall(r"`([^`]+)`", row[0]):
            assert path in paths, f"docs/dashboard.md: no dashboard route {path}"


def test_the_mcp_tool_table_is_the_tools():
    from api.mcp.tools import TOOL_NAMES

    documented = [dc.code_of(r[0]) for r in dc.table(DOCS / "llm-and-mcp.md", "tool")]
    assert sorted(documented) == sorted(TOOL_NAMES)  # type: ignore[type-var]
    named = re.findall(r"`(\w+)`", README.read_text().split("Its tools:")[1].split("\n\n")[0])
    assert sorted(named) == sorted(TOOL_NAMES)


def test_every_documented_request_names_a_route_and_a_body_it_accepts():
    assert dc.check_curls(dc.api_routes()) == []


def test_every_path_test_and_variable_named_exists():
    assert dc.check_names(dc.source_text()) == []


def test_every_link_and_every_pointer_from_the_code_resolves():
    assert dc.check_links() + dc.check_code_references() == []


def test_every_benchmark_command_runs_a_script_with_those_flags():
    assert dc.check_benchmark_commands() == []


def test_pages_are_references_and_figures_are_short_rows():
    """Each page ≤ 10 KB; each cell of benchmarks/README.md's table ≤ 300 characters."""
    big = {dc.rel(p): n for p in DOCS.glob("*.md") if (n := len(p.read_bytes())) > 10_000}
    assert big == {}
    rows = dc.table(dc.ROOT / "benchmarks" / "README.md", "what")
    long = [(r[0][:40], len(c)) for r in rows for c in r if len(c) > 300]
    assert long == []


# --- the checks themselves fail on what does not exist ---------------------------------------


def test_a_flag_or_subcommand_that_does_not_exist_is_caught(group):
    assert (
        dc.check_command(["overnight", "run", "--target", "x", "--budget", "1"], "t", group) == []
    )
    [wrong] = dc.check_command(["overnight", "run", "--target", "x", "--bugdet", "1"], "t", group)
    assert "--bugdet" in wrong
    [wrong] = dc.check_command(["overnight", "run", "--experiments", "1"], "t", group)
    assert "--target" in wrong  # a required option left out
    [wrong] = dc.check_command(["overnight", "gc", "--vacuum", "sometimes"], "t", group)
    assert "sometimes" in wrong  # a value the option refuses
    [wrong] = dc.check_command(["overnight", "sweep", "--all"], "t", group)
    assert "no subcommand 'sweep'" in wrong
    [wrong] = dc.check_command(["overnight", "status", "--every"], "t", group, full=False)
    assert "--every" in wrong


def test_a_key_that_does_not_exist_is_caught(tmp_path, monkeypatch, group):
    page = tmp_path / "page.md"
    page.write_text(
        "```toml\n[target]\ncommand = 'python t.py'\neditable = ['t.py']\n"
        "metric = 'm'\nbudget_s = 1\nbudget_seconds = 2\n```\n\n"
        "| key | default | meaning |\n| --- | --- | --- |\n"
        '| `command` | required | x |\n| `colour` | `"red"` | y |\n'
    )
    monkeypatch.setattr(dc, "PAGES", [page])
    [wrong] = dc.check_toml_blocks(tmp_path, group)
    assert "unknown key(s) budget_seconds" in wrong
    problems = dc.check_key_table(
        page,
        TargetConfig,
        {"command": "python t.py", "editable": ["t.py"], "metric": "m", "budget_s": 1},
        {"command", "editable", "metric", "budget_s"},
    )
    assert any("'colour'" in p and "does not accept" in p for p in problems)
    assert any("'seed'" in p and "not documented" in p for p in problems)


def test_shell_blocks_split_as_a_shell_would():
    text = (
        "TOKEN=$(cat ~/t) # c\novernight status; overnight results --sweep a \\\n"
        "  --format tsv > out.tsv\ncurl -d '{\"a\":\n 1}' localhost:8000/x && echo ok\n"
    )
    assert dc.commands(text) == [
        ["cat", "~/t"],
        ["overnight", "status"],
        ["overnight", "results", "--sweep", "a", "--format", "tsv"],
        ["curl", "-d", '{"a":\n 1}', "localhost:8000/x"],
        ["echo", "ok"],
    ]
    assert dc.overnight_argv(["claude", "mcp", "add", "o", "--", "overnight", "mcp"]) == [
        "overnight",
        "mcp",
    ]


# --- the tour, run -------------------------------------------------------------------------

LONG_RUNNING = {"serve", "mcp"}  # servers: their commands are parsed above, run elsewhere
# What is run, in this order, after the tour: every page's cheap commands on the tour's database
# (the rest need a server, a GPU, an LLM or a cluster: parsed above, not run).
RUN_AFTER = {
    "docs/keep-rule.md": {"results"},
    "docs/storage.md": {"gc"},
    "docs/llm-and-mcp.md": {"agent-instructions", "tools"},
    "docs/morning.md": {"report"},
}
SHORT = {"--budget": "1", "--experiments": "1"}  # a fake trainer's night, not a real one


def short(argv: list[str], home: Path) -> list[str]:
    """The README's command as typed, with `~` expanded and the budget and number of
    experiments of `run`/`doctor` cut to what a fake trainer needs."""
    out = [str(home) + a[1:] if a.startswith("~/") else a for a in argv]
    if out[1] in ("run", "doctor"):
        out = [
            SHORT[prev] if prev in SHORT else a
            for prev, a in zip(["", *out[:-1]], out, strict=True)
        ]
    return out


def fake_trainers(folder: Path) -> None:
    """./word_language_model as the README adopts it: an argparse trainer, data outside git."""
    wordlm = folder / "word_language_model"
    shutil.copytree(FIXTURES / "wordlm_target", wordlm)
    (wordlm / ".gitignore").write_text("data/\n")
    (wordlm / "data" / "wikitext-2").mkdir(parents=True)
    (wordlm / "data" / "wikitext-2" / "train.txt").write_text("the cat sat on the mat " * 100)
    init_repo(wordlm, "upstream")


def swap_in_the_fake_gpt(target: Path) -> None:
    """What `overnight init` made, with the fake trainer's train.py (same contract, instant)."""
    for name in ("train.py", "prepare.py", "overnight.toml"):
        shutil.copy(FIXTURES / "fake_target" / name, target / name)
    commit_all(target, "the fake trainer")


def test_the_readme_tour_runs_as_written(tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    fake_trainers(work)
    env = {
        "PATH": f"{BIN}{os.pathsep}/usr/bin:/bin",
        "HOME": str(home),
        "COLUMNS": "200",
        "GIT_AUTHOR_NAME": "n",
        "GIT_AUTHOR_EMAIL": "n@x",
        "GIT_COMMITTER_NAME": "n",
        "GIT_COMMITTER_EMAIL": "n@x",
    }
    ran = []
    todo = [(b, None) for b in dc.blocks(README)[1:]] + [
        (b, subs) for page, subs in RUN_AFTER.items() for b in dc.blocks(dc.ROOT / page)
    ]
    for block, subs in todo:
        if block.lang != "bash":
            continue
        for argv in dc.commands(block.text):
            if (
                argv[0] in dc.OVERNIGHT
                and argv[1] not in LONG_RUNNING
                and (subs is None or argv[1] in subs)
            ):
                argv = short(argv, home)
            elif argv[0] != "git" or subs is not None:
                continue
            if any(argv == done for done, _ in ran):  # once is enough (the same command)
                continue
            proc = subprocess.run(
                argv,
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=300,
            )
            assert proc.returncode == 0, f"{' '.join(argv)}:\n{proc.stdout}\n{proc.stderr}"
            ran.append((argv, proc.stdout))
            if argv[:2] == ["overnight", "init"]:
                swap_in_the_fake_gpt(work / argv[2])
    out = {" ".join(a[:2]): o for a, o in ran}
    assert set(out) >= {
        "overnight init",
        "overnight adopt",
        "overnight doctor",
        "overnight run",
        "overnight results",
        "overnight status",
        "overnight agent-instructions",
        "overnight gc",
        "overnight tools",
        "overnight report",
        "overnight finalize",
    }
    assert (work / "word_language_model" / "overnight.toml").is_file()
    assert "sweep nov29" in out["overnight run"] or "resuming sweep nov29" in out["overnight run"]
    tsv = next(o for a, o in ran if a[:2] == ["overnight", "results"] and "tsv" in a)
    assert tsv.splitlines()[0].split("\t") == [
        "commit",
        "val_bpb",
        "memory_gb",
        "status",
        "description",
    ]
    assert "nov29" in out["overnight status"]
    md = next(o for a, o in ran if a[:2] == ["overnight", "report"] and "--output" not in a)
    assert md.startswith("# Sweep `nov29`: the morning report")
    assert "<svg class=\"progress\"" in (work / "nov29.html").read_text()
    assert out["overnight finalize"].strip().splitlines()[-1] == "branch: overnight-final/nov29"
