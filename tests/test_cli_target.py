"""`overnight run` against a user's own checkout: dirty files refused, errors keep their text."""

from __future__ import annotations

from pathlib import Path

from test_cli import run

from agent.git.repo import GitRepo


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


def test_agent_instructions_leave_out_program_md_s_manual_git_loop(tmp_path: Path, target: Path):
    (target / "program.md").write_text(
        "# Program\n\nLowest val_bpb wins.\n\n## The loop\n\n1. Commit the change.\n"
        "2. Worse: `git reset --hard HEAD~1`.\n\n## Hints\n\nTry the learning rate.\n")
    GitRepo(target)._git("add", "program.md")
    GitRepo(target)._git("commit", "-m", "program")
    db = str(tmp_path / "o.db")
    run("run", "--target", str(target), "--experiments", "0", "--sweep", "p1", "--db", db)
    text = run("agent-instructions", "--sweep", "p1", "--db", db).stdout
    assert "Lowest val_bpb wins." in text and "Try the learning rate." in text
    assert "git reset" not in text and "Commit the change." not in text
    assert "the service commits, runs, keeps and resets" in text
