"""`overnight adopt` on a configurator-style script (top-level code, lowercase globals, a config
file and flags in the README's command, data git-ignored inside a tracked folder): what it
writes, then its printed contract lines applied literally by line number, then doctor and a
short real sweep whose proposals all change a live knob."""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path

from conftest import FIXTURES
from test_adopt import adopt
from test_cli import run

from agent.git.repo import init_repo
from agent.proposers.knob_chain import resolve

_ITEM = re.compile(r"; (?:(before|after) line (\d+)|(next)|in place of `(.+)` on line (\d+))"
                   r"[^\n]*:$")


def apply_todo(text: str, out: str) -> str:
    """Insert the lines each printed item gives at the place it names (as a user would)."""
    lines = text.split("\n")
    inserts: dict[int, list[str]] = {}
    anchor = 0
    block = out.split("still needs, for the contract:")[1].split("\nnext:")[0]
    for item in re.split(r"\n- ", block)[1:]:
        head, *body = item.split("\n")
        m = _ITEM.search(head)
        assert m, head
        given = [b[6:] for b in body if b.startswith("    | ")]
        if m.group(4):  # in place of `X` on line N
            n = int(m.group(5))
            lines[n - 1] = lines[n - 1].replace(m.group(4), given[0])
            continue
        if not m.group(3):
            anchor = int(m.group(2)) - (m.group(1) == "before")
        inserts.setdefault(anchor, []).extend(given)
    for at in sorted(inserts, reverse=True):
        lines[at:at] = inserts[at]
    return "\n".join(lines)


def configurator_repo(tmp_path: Path) -> Path:
    root = tmp_path / "toygpt"
    shutil.copytree(FIXTURES / "configurator_target", root)
    init_repo(root, "as shipped")
    (root / "data" / "toy" / "train.bin").write_text("abcdefgh" * 50)  # git-ignored data
    return root


def test_adopt_a_configurator_script_and_follow_what_it_prints(tmp_path: Path):
    root = configurator_repo(tmp_path)
    proc = adopt(str(root), "--budget", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    target = tomllib.loads((root / "overnight.toml").read_text())["target"]
    assert target["command"] == "python train.py config/train_small.py"  # the README's CPU line
    assert target["editable"] == ["train.py", "model.py", "config/train_small.py",
                                  "overnight.args"]
    assert target["args_file"] == "overnight.args" and target["metric"] == "val_loss"
    assert target["assets"] == ["data/toy/train.bin"]  # ignored, inside the tracked data/
    assert target["progress_regex"].startswith("iter (?P<step>")
    args = (root / "overnight.args").read_text()
    assert "--device=cpu  # knobs: skip\n" in args and "--learning_rate=0.02\n" in args
    assert "overnight_t0 = time.time()" in out and "t0 = time.time()" not in out.replace(
        "overnight_t0", "")  # the script resets its own t0 every step
    assert "under `if iter_num % eval_interval == 0`" in out and "losses = estimate_loss()" in out
    assert re.search(r"\d+ knob\(s\) will be searched; \d+ dead", out)
    (root / "train.py").write_text(apply_todo((root / "train.py").read_text(), out))
    with (root / "overnight.toml").open("a") as toml:
        toml.write('decision = "strict"\n')  # the fake trainer is deterministic: one run each
    init_repo(root, "overnight target")

    proc = run("doctor", "--target", str(root), "--budget", "1", "--timeout", "30", "--runs",
               "1", "--db", str(tmp_path / "o.db"), check=False)
    doc = proc.stdout
    assert proc.returncode == 0, doc + proc.stderr
    assert "✓ budget honoured" in doc and "✓ metric: val_loss" in doc, doc
    assert "✓ progress lines" in doc
    assert re.search(r"knob: batch_size = 8 \(config/train_small\.py:4\): dead, overnight\.args "
                     r"sets --batch_size=16", doc), doc
    assert "knob: ToyConfig.n_layer = 12 (model.py:10): dead, every ToyConfig(...) call" in doc
    assert "knob: --learning_rate = 0.02 (overnight.args:6): searched" in doc
    log = Path(next(line[5:] for line in doc.splitlines() if line.startswith("log: ")))
    assert log.is_relative_to(tmp_path / "o.db.work" / "doctor")  # --db: the logs are kept
    assert "Overriding: learning_rate = 0.02" in log.read_text()  # the args file reached it

    db = str(tmp_path / "o.db")
    run("run", "--target", str(root), "--experiments", "6", "--budget", "1", "--sweep", "c1",
        "--db", db)
    data = json.loads(run("results", "--sweep", "c1", "--format", "json", "--db", db).stdout)
    files = {p: (root / p).read_text() for p in target["editable"]}
    live = {s.knob.name for s in resolve(files, target["command"], "overnight.args") if s.searched}
    changed = [e for e in data["experiments"][1:]]
    assert len(changed) == 6 and {e["status"] for e in changed} <= {"kept", "discarded"}
    names = [e["description"].split(" ")[0] for e in changed]
    assert set(names) <= live, names
