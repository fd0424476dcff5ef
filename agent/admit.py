"""Admission: refuse a proposal before any budget is spent.

Pure: parses the unified diff and checks paths against the target's editable/protected lists.
Whether the diff applies to the sweep head is asked of the Repo port by the caller (`admit`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from agent.config import TargetConfig
from agent.domain import Proposal
from agent.errors import AdmissionError

MAX_DIFF_BYTES = 1024 * 1024
MAX_DESCRIPTION = 200
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_BAD_HEADERS = (
    ("GIT binary patch", "binary", "binary patches are not accepted"),
    ("Binary files ", "binary", "binary patches are not accepted"),
    ("new file mode 120000", "symlink", "symlinks are not accepted"),
    ("old mode ", "mode", "file mode changes are not accepted"),
    ("new mode ", "mode", "file mode changes are not accepted"),
    ("rename from ", "rename", "renames are not accepted"),
    ("copy from ", "rename", "copies are not accepted"),
)


@dataclass(frozen=True)
class FilePatch:
    old_path: str | None  # None for a new file
    new_path: str | None  # None for a deleted file
    hunks: int
    added: tuple[str, ...]
    removed: tuple[str, ...]

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


def _strip_prefix(raw: str) -> str | None:
    raw = raw.split("\t", 1)[0].strip()
    if raw == "/dev/null":
        return None
    if raw.startswith('"') and raw.endswith('"'):
        raw = raw[1:-1]
    if raw.startswith(("a/", "b/")):
        raw = raw[2:]
    return raw


def _check_path(path: str) -> str:
    p = PurePosixPath(path)
    if not path or p.is_absolute() or path.startswith("~"):
        raise AdmissionError(
            "path_escapes", f"absolute path {path!r} in diff; paths must be relative"
        )
    if ".." in p.parts:
        raise AdmissionError("path_escapes", f"path {path!r} escapes the repository ('..')")
    if p.parts and p.parts[0] == ".git":
        raise AdmissionError("path_escapes", f"path {path!r} is inside .git")
    return str(p)


def _hunk_body(lines: list[str], i: int) -> tuple[int, list[str], list[str]]:
    """Consume one hunk body starting at lines[i]; return next index, added, removed lines.

    Lenient about the header's line counts (git applies with --recount), strict about shape.
    """
    added: list[str] = []
    removed: list[str] = []
    while i < len(lines):
        line = lines[i]
        if line.startswith(("@@", "diff --git")):
            break
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            break
        tag = line[:1]
        if tag == "+":
            added.append(line[1:])
        elif tag == "-":
            removed.append(line[1:])
        elif tag not in (" ", "\\", ""):
            break
        i += 1
    return i, added, removed


def parse_diff(diff: str) -> list[FilePatch]:
    """Parse a unified (or git) diff into per-file patches. Raises AdmissionError."""
    if not diff.strip():
        raise AdmissionError("empty_diff", "the diff is empty: a proposal must change something")
    lines = diff.splitlines()
    patches: list[FilePatch] = []
    i = 0
    old = new = None
    while i < len(lines):
        line = lines[i]
        for marker, code, msg in _BAD_HEADERS:
            if line.startswith(marker):
                raise AdmissionError(code, msg)
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = _strip_prefix(line[4:]), _strip_prefix(lines[i + 1][4:])
            if old is None and new is None:
                raise AdmissionError("malformed_diff", "diff header names /dev/null twice")
            i += 2
            hunks, added, removed = 0, [], []
            while i < len(lines) and _HUNK.match(lines[i]):
                i, a, r = _hunk_body(lines, i + 1)
                added += a
                removed += r
                hunks += 1
            if hunks == 0:
                raise AdmissionError("malformed_diff", f"no hunks for {new or old!r} in diff")
            for p in (old, new):
                if p is not None:
                    _check_path(p)
            patches.append(FilePatch(old, new, hunks, tuple(added), tuple(removed)))
            continue
        if _HUNK.match(line):
            raise AdmissionError(
                "malformed_diff", "hunk without a '--- a/file' / '+++ b/file' header"
            )
        i += 1
    if not patches:
        raise AdmissionError(
            "malformed_diff", "no '--- a/file' / '+++ b/file' headers: not a unified diff"
        )
    if all(not p.added and not p.removed for p in patches):
        raise AdmissionError("empty_diff", "the diff changes no lines")
    return patches


def check_paths(patches: list[FilePatch], config: TargetConfig) -> None:
    """Every touched file must be editable and none protected."""
    editable, protected = set(config.editable), set(config.protected)
    for patch in patches:
        for path in {p for p in (patch.old_path, patch.new_path) if p is not None}:
            norm = _check_path(path)
            if norm in protected:
                raise AdmissionError(
                    "protected_file", f"{norm} is protected and may not be changed"
                )
            if norm not in editable:
                allowed = ", ".join(sorted(editable))
                raise AdmissionError(
                    "not_editable", f"{norm} is not editable (editable files: {allowed})"
                )


def normalize_diff(diff: str) -> str:
    """A canonical form of a diff's changes, for near-duplicate detection."""
    try:
        patches = parse_diff(diff)
    except AdmissionError:
        return diff.strip()
    parts = []
    for p in sorted(patches, key=lambda p: p.path):
        body = "\n".join(
            ["-" + r.rstrip() for r in p.removed] + ["+" + a.rstrip() for a in p.added]
        )
        parts.append(f"{p.path}\n{body}")
    return "\n".join(parts)


def diff_key(diff: str) -> str | None:
    """A short hash of the normalized diff (None for an empty one): the duplicate check's key."""
    return hashlib.sha256(normalize_diff(diff).encode()).hexdigest() if diff.strip() else None


def clean_description(description: str) -> str:
    text = " ".join((description or "").split())
    if not text:
        raise AdmissionError("no_description", "a proposal needs a one-line description")
    return text[:MAX_DESCRIPTION]


def check_proposal(proposal: Proposal, config: TargetConfig) -> list[FilePatch]:
    """All checks that need no git: size, description, diff shape, paths."""
    if len(proposal.diff.encode("utf-8", "replace")) > MAX_DIFF_BYTES:
        raise AdmissionError("too_large", f"diff is larger than {MAX_DIFF_BYTES} bytes", 413)
    clean_description(proposal.description)
    patches = parse_diff(proposal.diff)
    check_paths(patches, config)
    return patches
