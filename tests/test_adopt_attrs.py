"""`overnight adopt` and `doctor` on a script in minGPT's shape (tests/fixtures/cfgnode_target):
CfgNode configs set by attribute and `--section.key=value` flags, the training loop in a
library package the script imports, the package pip-installed in editable mode as its README
says. What adopt writes, its printed lines applied by file and line number, doctor, a short
real sweep; and doctor on the shadowing copies (an editable install, a PYTHONPATH, none)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import FIXTURES
from test_adopt import adopt
from test_cli import run

from agent.git.repo import init_repo
from agent.proposers.knob_chain import resolve

SCRIPT = "projects/charlm/charlm.py"
_WHERE = re.compile(r"; (?:in (\S+), )?(?:(before|after) line (\d+)|(next)|in place of `(.+)` "
                    r"on line (\d+))[^\n]*:$")


def apply_todo(root: Path, script: str, out: str) -> None:
    """Put the lines of each printed item where it says, in the file it names (the script
    when it names none), as a user would: line numbers are those of the file as shipped."""
    inserts: dict[str, dict[int, list[str]]] = {}
    texts: dict[str, list[str]] = {}
    anchor: dict[str, int] = {}
    block = out.split("still needs, for the contract:")[1].split("\nnext:")[0]
    for item in re.split(r"\n- ", block)[1:]:
        head, *body = item.split("\n")
        m = _WHERE.search(head)
        assert m, head
        path = m.group(1) or script
        lines = texts.setdefault(path, (root / path).read_text().split("\n"))
        given = [b[6:] for b in body if b.startswith("    | ")]
        if m.group(5):
            n = int(m.group(6))
            lines[n - 1] = lines[n - 1].replace(m.group(5), given[0])
            continue
        if not m.group(4):
            anchor[path] = int(m.group(3)) - (m.group(2) == "before")
        inserts.setdefault(path, {}).setdefault(anchor[path], []).extend(given)
    for path, lines in texts.items():
        for at in sorted(inserts.get(path, {}), reverse=True):
            lines[at:at] = inserts[path][at]
        (root / path).write_text("\n".join(lines))


def charlm(tmp_path: Path) -> Path:
    root = tmp_path / "toylib"
    shutil.copytree(FIXTURES / "cfgnode_target", root)
    init_repo(root, "as shipped")
    (root / "data").mkdir()
    (root / "data" / "input.txt").write_text("O God, O God! the cat sat on the mat.\n" * 50)
    return root


def test_adopt_doctor_and_a_short_sweep_on_an_attribute_config_script(tmp_path: Path):
    root = charlm(tmp_path)
    proc = adopt(str(root), "--budget", "1")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    target = tomllib.loads((root / "overnight.toml").read_text())["target"]
    # the script that prints the metric, not projects/zsort/train_sort.py (a `train` name)
    assert target["command"] == "python -m projects.charlm.charlm"  # imports the worktree's
    assert target["editable"] == [SCRIPT, "toylib/model.py", "toylib/trainer.py",
                                  "toylib/utils.py", "overnight.args"]
    assert target["metric"] == "test_acc" and target["direction"] == "maximize"
    assert "direction = maximize: `acc` in `test_acc`: higher is better" in out
    assert target["assets"] == ["data"]
    # from the lines the probe printed, not the Hugging Face regex the word `Trainer(` suggests
    assert target["progress_regex"].startswith(r"iter\s+(?P<step>\d+):\s+train\s+loss")
    assert re.search(r"probe: ran the command [\d.]+ s \(stopped after 3 lines with a loss\); "
                     r"progress_regex fits \d+ of", out)
    assert "9 knob(s) will be searched; 5 dead" in out
    assert "in toylib/trainer.py, before line 41, `while True:`" in out
    assert "in toylib/trainer.py, after line 6, the last top-level import:\n    | import os" in out
    assert ("in toylib/trainer.py, after line 52, where the loop ends:\n"
            "    |         self.overnight_trained_s = time.time() - overnight_t0") in out
    assert "after line 83, where `trainer.run()` ends:\n    |     acc = evaluate(model, trainer)" \
        in out
    assert "    |     print(f'training_seconds: {trainer.overnight_trained_s:.1f}')" in out
    assert "    |     print(f'num_steps: {trainer.iter_num}')" in out
    apply_todo(root, SCRIPT, out)
    for path in (SCRIPT, "toylib/trainer.py"):
        compile((root / path).read_text(), path, "exec")
    init_repo(root, "overnight target")

    proc = run("doctor", "--target", str(root), "--budget", "1", "--timeout", "30", check=False)
    doc = proc.stdout
    assert proc.returncode == 0, doc + proc.stderr
    for line in ("✓ imports: toylib from the run's worktree", "✓ budget honoured",
                 "✓ metric: test_acc", "✓ progress lines", "✓ seed used",
                 "· early stop: prune = \"auto\" (the default): can work"):
        assert line in doc, line
    assert re.search(r"· knob: trainer\.learning_rate = 3e-4 \(toylib/trainer\.py:19\): dead, "
                     r"set again at projects/charlm/charlm\.py:\d+: trainer\.learning_rate = "
                     r"5e-4", doc), doc
    assert "✓ knob: trainer.betas[1] = 0.95 (toylib/trainer.py:20): searched" in doc

    db = str(tmp_path / "o.db")
    run("run", "--target", str(root), "--experiments", "3", "--budget", "1", "--sweep", "a1",
        "--db", db)
    data = json.loads(run("results", "--sweep", "a1", "--format", "json", "--db", db).stdout)
    changed = data["experiments"][1:]
    assert len(changed) == 3 and {e["status"] for e in changed} <= {"kept", "discarded"}, changed
    files = {p: (root / p).read_text() for p in target["editable"]}
    live = {s.knob.name for s in resolve(files, target["command"], "overnight.args")
            if s.searched}
    names = [e["description"].split(" ")[0] for e in changed]
    assert set(names) <= live and any(not n.startswith("--") for n in names), names


def _shadow_target(root: Path, python: str) -> None:
    (root / "overnight.toml").write_text(
        f'[target]\ncommand = "{python} {SCRIPT} --trainer.max_iters=30"\n'
        f'editable = ["{SCRIPT}", "toylib/model.py", "toylib/trainer.py"]\n'
        'metric = "test_acc"\ndirection = "maximize"\nbudget_s = 1\nassets = ["data"]\n')
    init_repo(root, "target")


def doctor(root: Path, env: dict[str, str] | None = None) -> str:
    proc = run("doctor", "--target", str(root), "--budget", "1", "--timeout", "30", "--runs",
               "1", env=env, check=False)
    return " ".join(proc.stdout.split())  # rich wraps long lines


def test_doctor_catches_the_package_imported_from_outside_the_worktree(tmp_path: Path):
    root = charlm(tmp_path)
    # The user's environment with the package installed in editable mode, as its README says:
    # setuptools' develop command (an egg-link and easy-install.pth: what `pip install -e` runs
    # for a setup.py project where no `wheel` package is at hand, as here, offline).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "setup.py", "-q", "develop"], cwd=root, check=True, timeout=120,
                   capture_output=True)
    assert (root / "toylib.egg-info").is_dir()  # git-ignored, like the package's own build
    _shadow_target(root, python)
    out = doctor(root)
    assert (f"✗ imports: the run imports this repository's code from outside its worktree: "
            f"toylib from {root}/toylib/__init__.py (an installed copy: toylib, e.g. pip "
            "install -e): proposals that change toylib/model.py, toylib/trainer.py never reach "
            "the run") in out, out
    fix = f'command = "{python} -m projects.charlm.charlm --trainer.max_iters=30"'
    assert fix in out and "pip uninstall toylib" in out
    # progress lines no progress_regex reads: one that fits what this run printed
    assert re.search(r"progress lines: no line such as .* fix: set progress_regex = "
                     r"'iter\\s\+\(\?P<step>", out), out
    assert re.search(r"· early stop: .* no progress line with a loss; to turn it on: set "
                     r"progress_regex = 'iter", out), out
    toml = root / "overnight.toml"
    toml.write_text(toml.read_text().replace(f"{python} {SCRIPT}",
                                             f"{python} -m projects.charlm.charlm"))
    init_repo(root, "run from the worktree")
    assert "✓ imports: toylib from the run's worktree" in doctor(root)

    _shadow_target(root, "python")  # overnight's interpreter: no copy installed
    out = doctor(root)
    assert "✗ runs: the run failed: ModuleNotFoundError: No module named 'toylib'" in out
    assert ("fix: toylib is this repository's own package (toylib/), but "
            f"`{SCRIPT}` puts only its own folder on sys.path: command = \"python -m "
            "projects.charlm.charlm --trainer.max_iters=30\"") in out, out
    assert "run the command by hand" not in out and "✗ imports" not in out
    assert "printed no line with a training loss" not in out  # it failed before training
    out = doctor(root, env={"PYTHONPATH": str(root)})
    assert f"toylib from {root}/toylib/__init__.py (PYTHONPATH)" in out, out


def test_the_fix_puts_the_right_folder_first_on_the_path(tmp_path: Path):
    from agent.ops.doctor import (
        ImportFacts,
        check_imports,
        repo_packages,
        worktree_command,
    )

    for path in ("lib/__init__.py", "src/pkg/__init__.py", "tools/helpers.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    code = "import os, lib\nfrom pkg.x import y\nimport helpers\n"
    assert repo_packages(tmp_path, [code], "tools/run.py") == {"lib": "lib/", "pkg": "src/pkg/"}
    assert worktree_command("python tools/run.py --a=1", "tools/run.py") == \
        "python -m tools.run --a=1"
    assert worktree_command("python tools/my-run.py", "tools/my-run.py") is None
    wt = tmp_path / "wt"
    facts = ImportFacts("python tools/run.py", "tools/run.py", wt, {"pkg": "src/pkg/"},
                        {"pkg": None})
    check = check_imports(facts, ["tools/run.py"])
    assert check is not None and check.status == "fail"
    assert 'command = "env PYTHONPATH=src python tools/run.py"' in check.fix
    inside = ImportFacts("python tools/run.py", "tools/run.py", wt, {"lib": "lib/"},
                         {"lib": str(wt / "lib" / "__init__.py")})
    assert check_imports(inside, []) == check_imports(inside, ["lib/a.py"])
    assert check_imports(inside, []).status == "ok"  # type: ignore[union-attr]
