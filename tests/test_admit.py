"""Admission: each rejection reason, with nothing run and nothing moved."""

from pathlib import Path

import pytest

from agent.core.config import load_config
from agent.core.domain import ExperimentStatus, Proposal
from agent.core.errors import AdmissionError
from agent.git.repo import GitRepo
from agent.ops.admission import admit, queue, reject
from agent.ops.sweeps import create_sweep
from agent.proposers.knobs import make_diff
from agent.rules.admit import normalize_diff, parse_diff


def lr_diff(target: Path, new: str = "0.02") -> str:
    text = (target / "train.py").read_text()
    return make_diff("train.py", text, text.replace("LR = 0.01", f"LR = {new}"))


GOOD_HEADER = "--- a/train.py\n+++ b/train.py\n"
BAD = {
    "empty_diff": "",
    "malformed_diff": "this is prose, not a diff\n",
    "not_editable": "--- a/other.py\n+++ b/other.py\n@@ -0,0 +1 @@\n+x = 1\n",
    "protected_file": "--- a/prepare.py\n+++ b/prepare.py\n@@ -1 +1 @@\n-x\n+y\n",
    "path_escapes": "--- a/../evil.py\n+++ b/../evil.py\n@@ -0,0 +1 @@\n+x\n",
    "binary": "diff --git a/train.py b/train.py\nGIT binary patch\nliteral 0\n",
    "symlink": "diff --git a/train.py b/train.py\nnew file mode 120000\n",
    "does_not_apply": GOOD_HEADER + "@@ -1,1 +1,1 @@\n-no such line\n+other line\n",
}


@pytest.fixture
def sweep(store, target):
    return create_sweep(store, GitRepo(target), target, name="adm", config=load_config(target))


@pytest.mark.parametrize("code", sorted(BAD))
def test_each_rejection_writes_nothing_when_not_recording(store, target, sweep, code):
    repo = GitRepo(target)
    head = repo.head(sweep.branch)
    before = store.count_experiments(sweep.id)
    with pytest.raises(AdmissionError) as exc:
        queue(store, admit(store, repo, sweep, Proposal("try it", BAD[code])))
    assert exc.value.code == code, exc.value.message
    assert exc.value.status_hint == (409 if code == "does_not_apply" else 422)
    assert store.count_experiments(sweep.id) == before
    assert repo.head(sweep.branch) == head


@pytest.mark.parametrize("code", sorted(BAD))
def test_each_rejection_is_recorded_with_reason(store, target, sweep, code):
    proposal = Proposal("try it", BAD[code], "knobs")
    with pytest.raises(AdmissionError) as refused:
        admit(store, GitRepo(target), sweep, proposal)
    exp = reject(store, sweep, proposal, refused.value)
    assert exp.status is ExperimentStatus.REJECTED
    assert exp.reason and exp.meta["rejection"] == code
    assert exp.started_at is None and exp.log_path is None


def test_absolute_path_and_dotgit(store, target, sweep):
    for path in ("/etc/passwd", ".git/config"):
        diff = (
            f"--- a{path if path.startswith('/') else '/' + path}\n+++ b/{path.lstrip('/')}\n"
            "@@ -1 +1 @@\n-a\n+b\n"
        )
        with pytest.raises(AdmissionError) as exc:
            queue(store, admit(store, GitRepo(target), sweep, Proposal("x", diff)))
        assert exc.value.code in ("path_escapes", "not_editable")


def test_duplicate_and_description(store, target, sweep):
    repo = GitRepo(target)
    first = queue(store, admit(store, repo, sweep, Proposal("double lr", lr_diff(target))))
    assert first.status is ExperimentStatus.QUEUED
    with pytest.raises(AdmissionError) as exc:
        queue(store, admit(store, repo, sweep, Proposal("again", lr_diff(target))))
    assert exc.value.code == "duplicate" and str(first.id) in exc.value.message
    with pytest.raises(AdmissionError) as exc:
        queue(store, admit(store, repo, sweep, Proposal("  ", lr_diff(target, "0.03"))))
    assert exc.value.code == "no_description"
    with pytest.raises(AdmissionError) as exc:
        queue(store, admit(store, repo, sweep, Proposal("big", "+" * (1024 * 1024 + 1))))
    assert exc.value.status_hint == 413


def test_normalize_diff_ignores_context_and_headers(target):
    a = lr_diff(target)
    b = a.replace("--- a/train.py", "--- train.py").replace("+++ b/train.py", "+++ train.py")
    assert normalize_diff(a) == normalize_diff(b)
    assert normalize_diff(a) != normalize_diff(lr_diff(target, "0.03"))


def test_lenient_hunk_counts_still_apply(store, target, sweep):
    """LLM-written diffs often get the @@ counts wrong; git applies them with --recount."""
    diff = GOOD_HEADER + "@@ -9,9 +9,9 @@\n-LR = 0.01  # best at 0.04\n+LR = 0.02  # best at 0.04\n"
    assert parse_diff(diff)[0].added == ("LR = 0.02  # best at 0.04",)
    exp = queue(store, admit(store, GitRepo(target), sweep, Proposal("lr", diff)))
    assert exp.status is ExperimentStatus.QUEUED
