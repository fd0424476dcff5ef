"""Admission: refuse a proposal before any budget is spent.

Pure: reads the diff with agent.core.diff (lines end at "\\n" only, as in git) and checks paths
against the target's editable/protected lists; `check_changes` checks git's own view of what
an applied diff changed (agent.core.diff.PathChange). Whether the diff applies to the sweep head,
and what it then changes, is asked of the Repo port by the caller (agent.ops.admission.place).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

from agent.core.config import TargetConfig
from agent.core.diff import (
    NO_FILE,
    REGULAR_MODES,
    FilePatch,
    PathChange,
    check_path,
    normalize,
    parse,
)
from agent.core.domain import Proposal
from agent.core.errors import AdmissionError

MAX_DIFF_BYTES = 1024 * 1024
MAX_DESCRIPTION = 200
_SPECIAL_MODES = {"120000": ("symlink", "symlinks"), "160000": ("submodule", "submodules")}

__all__ = ["FilePatch", "check_changes", "check_paths", "check_proposal", "clean_description",
           "diff_key", "normalize_diff", "parse_diff"]

parse_diff = parse
normalize_diff = normalize


def _check_editable(path: str, editable: set[str], protected: set[str]) -> None:
    norm = check_path(path)
    if norm in protected:
        raise AdmissionError("protected_file", f"{norm} is protected and may not be changed")
    if norm not in editable:
        allowed = ", ".join(sorted(editable))
        raise AdmissionError("not_editable", f"{norm} is not editable (editable files: {allowed})")


def check_paths(patches: list[FilePatch], config: TargetConfig) -> None:
    """Every touched file must be editable and none protected."""
    editable, protected = set(config.editable), set(config.protected)
    for patch in patches:
        for path in {p for p in (patch.old_path, patch.new_path) if p is not None}:
            _check_editable(path, editable, protected)


def check_changes(changes: list[PathChange], config: TargetConfig) -> None:
    """Git's view of an applied diff: only editable regular files, no mode or type changes.

    Raises AdmissionError naming the first offending path.
    """
    if not changes:
        raise AdmissionError("empty_diff", "the diff changes nothing once applied")
    editable, protected = set(config.editable), set(config.protected)
    for change in changes:
        for mode in (change.old_mode, change.new_mode):
            if mode in _SPECIAL_MODES:
                code, what = _SPECIAL_MODES[mode]
                raise AdmissionError(code, f"{what} are not accepted ({change.path!r})")
        _check_editable(change.path, editable, protected)
        modes = {change.old_mode, change.new_mode} - {NO_FILE}
        if not modes <= REGULAR_MODES:
            raise AdmissionError("mode", f"{change.path!r}: only regular files are accepted")
        if change.status == "T" or len(modes) > 1:
            raise AdmissionError("mode", f"file mode changes are not accepted ({change.path!r})")


@lru_cache(maxsize=32)
def diff_key(diff: str) -> str | None:
    """A short hash of the normalized diff (None for an empty one): the duplicate check's key.

    Remembered for the last few diffs: one admission asks for it twice (the duplicate lookup,
    then the insert), and each answer parses the whole diff."""
    return hashlib.sha256(normalize(diff).encode()).hexdigest() if diff.strip() else None


def clean_description(description: str) -> str:
    text = " ".join((description or "").split())
    if not text:
        raise AdmissionError("no_description", "a proposal needs a one-line description")
    return text[:MAX_DESCRIPTION]


def check_proposal(proposal: Proposal, config: TargetConfig) -> list[FilePatch]:
    """The checks of a diff that need no git: size, shape, paths (the description is
    clean_description's)."""
    if len(proposal.diff.encode("utf-8", "replace")) > MAX_DIFF_BYTES:
        raise AdmissionError("too_large", f"diff is larger than {MAX_DIFF_BYTES} bytes", 413)
    patches = parse_diff(proposal.diff)
    check_paths(patches, config)
    return patches
