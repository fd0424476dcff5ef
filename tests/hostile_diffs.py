"""Hostile diffs against the fake target (train.py editable; prepare.py, overnight.toml
protected; README.md present but not editable). Shared by tests/test_gitview.py and
benchmarks/containment.py; every one of them must be refused before a run is queued.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from agent.core.diff import PathChange, parse_diff_tree
from agent.git.repo import GitRepo

README = "old readme\n"
# Characters str.splitlines() breaks at but git does not.
SEPARATORS = {"x1c": "\x1c", "x1d": "\x1d", "x1e": "\x1e", "cr": "\r", "x85": "\x85",
              "u2028": "\u2028", "u2029": "\u2029", "vt": "\x0b", "ff": "\x0c"}
SITECUSTOMIZE = "import pathlib; pathlib.Path('/tmp/overnight-pwned').write_text('pwned')"


def good_hunk(target: Path) -> str:
    """A legitimate change to train.py to hide the rest behind."""
    return ("--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-"
            + (target / "train.py").read_text().split("\n", 1)[0] + "\n+# a harmless edit\n")


def smuggled(target: Path) -> dict[str, str]:
    """A second file header made invisible to a str.splitlines() reader."""
    good = good_hunk(target)
    cases = {}
    for name, sep in SEPARATORS.items():
        cases[f"readme_behind_{name}"] = (good + f"--- a/README.md{sep}x\n+++ b/README.md\n"
                                          "@@ -1 +1 @@\n-old readme\n+pwned\n")
        cases[f"sitecustomize_behind_{name}"] = (
            good + f"--- /dev/null{sep}x\n+++ b/sitecustomize.py\n@@ -0,0 +1 @@\n"
            f"+{SITECUSTOMIZE}\n")
    return cases


def git_only(target: Path) -> dict[str, str]:
    """Changes a reader of ---/+++ headers alone does not see, but git applies."""
    good = good_hunk(target)
    return {
        "empty_new_file": ("diff --git a/sitecustomize.py b/sitecustomize.py\nnew file mode "
                           "100644\nindex 0000000..e69de29\n" + good),
        "empty_new_file_after": good + ("diff --git a/evil.py b/evil.py\nnew file mode 100644\n"
                                        "index 0000000..e69de29\n"),
        "mode_only": "diff --git a/train.py b/train.py\nold mode 100644\nnew mode 100755\n" + good,
        "delete_empty_readme_like": good + ("diff --git a/empty.txt b/empty.txt\ndeleted file "
                                            "mode 100644\nindex e69de29..0000000\n"),
    }


def classic(target: Path) -> dict[str, str]:
    """The shapes admission refused before (kept refused)."""
    good = good_hunk(target)
    header = "--- a/train.py\n+++ b/train.py\n"
    return {
        "not_editable": "--- a/other.py\n+++ b/other.py\n@@ -0,0 +1 @@\n+x = 1\n",
        "protected": "--- a/prepare.py\n+++ b/prepare.py\n@@ -1 +1 @@\n-x\n+y\n",
        "escape_dotdot": "--- a/../evil.py\n+++ b/../evil.py\n@@ -0,0 +1 @@\n+x\n",
        "escape_inner_dotdot": good.replace("+++ b/train.py", "+++ b/train.py/../README.md"),
        "absolute": "--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-x\n+y\n",
        "dotgit_hook": "--- /dev/null\n+++ b/.git/hooks/post-checkout\n@@ -0,0 +1 @@\n+id\n",
        "binary": "diff --git a/train.py b/train.py\nGIT binary patch\nliteral 0\n",
        "symlink": "diff --git a/train.py b/train.py\nnew file mode 120000\n",
        "submodule": "diff --git a/sub b/sub\nnew file mode 160000\nindex 0000000..1234567\n",
        "rename": ("diff --git a/train.py b/evil.py\nsimilarity index 100%\nrename from "
                   "train.py\nrename to evil.py\n"),
        "copy": ("diff --git a/train.py b/evil.py\nsimilarity index 100%\ncopy from train.py\n"
                 "copy to evil.py\n"),
        "dot_slash_readme": good + "--- a/./README.md\n+++ b/./README.md\n@@ -1 +1 @@\n"
                                   "-old readme\n+pwned\n",
        "traditional_other_name": "--- a/train.py\n+++ b/README.md\n@@ -1 +1 @@\n-old readme\n"
                                  "+pwned\n",
        "quoted_readme": good + '--- "a/README.md"\n+++ "b/README.md"\n@@ -1 +1 @@\n'
                                "-old readme\n+pwned\n",
        "git_header_names_readme": ("diff --git a/README.md b/README.md\n" + header
                                    + good.split("\n", 2)[2]),
        "crlf_readme": (good + "--- a/README.md\r\n+++ b/README.md\r\n@@ -1 +1 @@\r\n"
                        "-old readme\r\n+pwned\r\n"),
        "hunk_without_header": "@@ -1 +1 @@\n-x\n+y\n",
        "empty": "",
        "prose": "this is prose, not a diff\n",
    }


def all_cases(target: Path) -> dict[str, str]:
    return {**classic(target), **smuggled(target), **git_only(target)}


def committed_changes(repo: GitRepo, commit: str) -> list[PathChange]:
    """What `commit` changes against its first parent, as `git diff-tree` says it."""
    out = subprocess.run(["git", "diff-tree", "-r", "--no-renames", "--no-commit-id", "-z",
                          f"{commit}^", commit], cwd=repo.path, capture_output=True,
                         check=True).stdout
    return parse_diff_tree(out)
