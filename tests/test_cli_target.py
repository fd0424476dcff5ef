"""`overnight run` against a user's own checkout: dirty files refused, errors keep their text."""

from __future__ import annotations

from pathlib import Path

from test_cli import run

from agent.gitrepo import GitRepo


def test_a_dirty_checkout_is_refused_with_the_files_and_the_command(tmp_path: Path,
                                                                    target: Path):
    db = str(tmp_path / "o.db")
    head = GitRepo(target).head("HEAD")
    (target / "train.py").write_text((target / "train.py").read_text() + "\n# tweak\n")
    (target / "notes.txt").write_text("an untracked file that no run reads")
    proc = run("run", "--target", str(target), "--experiments", "0", "--db", db, check=False)
    assert proc.returncode == 2 and "uncommitted changes" in proc.stderr
    assert "train.py" in proc.stderr and "notes.txt" not in proc.stderr
    assert f"git -C {target} add -- train.py" in " ".join(proc.stderr.split())
    assert not GitRepo(target).has_ref("refs/heads/overnight/" + "x")
    assert "overnight/" not in GitRepo(target)._git("branch", "--list", "overnight/*")
    proc = run("run", "--target", str(target), "--experiments", "0", "--db", db,
               "--allow-dirty", "--sweep", "d1")
    assert "--allow-dirty" in proc.stdout and "NOT run" in proc.stdout
    assert GitRepo(target).head("overnight/d1") == head


def test_config_errors_keep_their_bracketed_text(tmp_path: Path, target: Path):
    toml = target / "overnight.toml"
    toml.write_text(toml.read_text().replace("budget_s  = 1", "budget_secs = 1"))
    GitRepo(target)._git("commit", "-am", "typo")
    proc = run("run", "--target", str(target), "--db", str(tmp_path / "o.db"), check=False)
    assert proc.returncode == 2
    assert "unknown key(s) budget_secs in [target]" in proc.stderr
