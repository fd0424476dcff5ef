"""The one unified-diff module: read diffs as git does, write them, and read git's own view.

Pure: stdlib only; imports nothing but agent.core.errors. Used by admission (agent.rules.admit), the
LLM answer parser (agent.proposers.llm), the proposers that write diffs and the dashboard's
diff view. Lines end at "\\n" only, as in git: "\\r", "\\x1c", "\\x85", "\\u2028" and the other
characters str.splitlines() also breaks at are part of a line, so no file header can hide behind
one. Guaranteed: `parse` raises AdmissionError for anything it does not understand; `view_lines` and
`diff_stats` never raise. Not guaranteed: that git applies what `parse` accepts (git stays the final
authority: see `parse_diff_tree` for reading what it actually changed).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from agent.core.errors import AdmissionError

HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
NO_NEWLINE = "\\ No newline at end of file"
_GIT_HEADER = re.compile(r"^diff --git (\S+) (\S+)$")
_BAD_HEADERS = (
    ("GIT binary patch", "binary", "binary patches are not accepted"),
    ("Binary files ", "binary", "binary patches are not accepted"),
    ("new file mode 120000", "symlink", "symlinks are not accepted"),
    ("new file mode 160000", "submodule", "submodules are not accepted"),
    ("old mode ", "mode", "file mode changes are not accepted"),
    ("new mode ", "mode", "file mode changes are not accepted"),
    ("rename from ", "rename", "renames are not accepted"),
    ("rename to ", "rename", "renames are not accepted"),
    ("copy from ", "rename", "copies are not accepted"),
    ("copy to ", "rename", "copies are not accepted"),
)


def split_lines(text: str) -> list[str]:
    """Lines as git sees them: split at "\\n" only; a final "\\n" ends the last line."""
    if not text:
        return []
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


# --- writing --------------------------------------------------------------------------------
def make_diff(path: str, old: str, new: str) -> str:
    """A unified diff (3 lines of context) turning ``old`` into ``new``; "" if they are equal."""
    # difflib wants each line with its end; a last line without one gets git's marker.
    out = []
    for line in difflib.unified_diff(lines_with_ends(old), lines_with_ends(new),
                                     fromfile=f"a/{path}", tofile=f"b/{path}", n=3):
        out.append(line if line.endswith("\n") else f"{line}\n{NO_NEWLINE}\n")
    return "".join(out)


def lines_with_ends(text: str) -> list[str]:
    """Lines split at "\\n" only, each keeping its "\\n" ("a\\nb" -> ["a\\n", "b"])."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def files_diff(before: dict[str, str], after: dict[str, str]) -> str:
    """One diff for every file whose text changed (paths in sorted order)."""
    changed = [p for p in sorted(after) if after[p] != before.get(p)]
    return "".join(make_diff(p, before.get(p, ""), after[p]) for p in changed)


# --- reading (admission: strict) ------------------------------------------------------------
@dataclass(frozen=True)
class Hunk:
    old_start: int
    new_start: int
    body: tuple[str, ...]  # the lines after the @@ header, each with its " ", "+", "-" tag

    @property
    def added(self) -> tuple[str, ...]:
        return tuple(line[1:] for line in self.body if line.startswith("+"))

    @property
    def removed(self) -> tuple[str, ...]:
        return tuple(line[1:] for line in self.body if line.startswith("-"))


@dataclass(frozen=True)
class FilePatch:
    old_path: str | None  # None for a new file
    new_path: str | None  # None for a deleted file
    hunks: tuple[Hunk, ...]

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""

    @property
    def added(self) -> tuple[str, ...]:
        return tuple(line for h in self.hunks for line in h.added)

    @property
    def removed(self) -> tuple[str, ...]:
        return tuple(line for h in self.hunks for line in h.removed)


def strip_prefix(raw: str) -> str | None:
    """A header's path without its a/ or b/ prefix; None for /dev/null."""
    raw = raw.split("\t", 1)[0].strip()
    if raw == "/dev/null":
        return None
    if raw.startswith('"') and raw.endswith('"'):
        raw = raw[1:-1]
    if raw.startswith(("a/", "b/")):
        raw = raw[2:]
    return raw


def check_path(path: str) -> str:
    """The normalised relative path; AdmissionError if it leaves the repository."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or path.startswith("~"):
        raise AdmissionError("path_escapes", f"absolute path {path!r} in diff; paths must be "
                             "relative")
    if ".." in p.parts:
        raise AdmissionError("path_escapes", f"path {path!r} escapes the repository ('..')")
    if p.parts and p.parts[0] == ".git":
        raise AdmissionError("path_escapes", f"path {path!r} is inside .git")
    return str(p)


def _is_file_header(lines: list[str], i: int) -> bool:
    return lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")


def _hunk_body(lines: list[str], i: int) -> tuple[int, tuple[str, ...]]:
    """Consume one hunk body from lines[i]; (next index, body lines).

    Lenient about the header's line counts (git applies with --recount), strict about shape:
    the body ends at the next hunk, file header, or a line with another tag.
    """
    start = i
    while i < len(lines):
        line = lines[i]
        if line.startswith(("@@", "diff --git")) or _is_file_header(lines, i):
            break
        if line[:1] not in (" ", "+", "-", "\\", ""):
            break
        i += 1
    return i, tuple(line for line in lines[start:i] if not line.startswith("\\"))


def _file_patch(lines: list[str], i: int) -> tuple[int, FilePatch]:
    """The file header at lines[i] and its hunks; (next index, patch)."""
    old, new = strip_prefix(lines[i][4:]), strip_prefix(lines[i + 1][4:])
    if old is None and new is None:
        raise AdmissionError("malformed_diff", "diff header names /dev/null twice")
    i += 2
    hunks = []
    while i < len(lines) and (m := HUNK_HEADER.match(lines[i])):
        i, body = _hunk_body(lines, i + 1)
        hunks.append(Hunk(int(m.group(1)), int(m.group(3)), body))
    if not hunks:
        raise AdmissionError("malformed_diff", f"no hunks for {new or old!r} in diff")
    for p in (old, new):
        if p is not None:
            check_path(p)
    return i, FilePatch(old, new, tuple(hunks))


def _check_meta_line(line: str) -> set[str] | None:
    """Refuse the git extended headers admission never accepts; check `diff --git` paths.

    Returns the paths a `diff --git` line names (None for other lines).
    """
    for marker, code, msg in _BAD_HEADERS:
        if line.startswith(marker):
            raise AdmissionError(code, msg)
    m = _GIT_HEADER.match(line)
    if m is None:
        return None
    return {check_path(p) for p in map(strip_prefix, m.groups()) if p is not None}


def _check_same_file(git_paths: set[str] | None, patch: FilePatch) -> None:
    named = {check_path(p) for p in (patch.old_path, patch.new_path) if p is not None}
    if git_paths is not None and not named <= git_paths:
        raise AdmissionError("malformed_diff", f"'diff --git' names {sorted(git_paths)} but "
                             f"its ---/+++ lines name {sorted(named)}")


def parse(diff: str) -> list[FilePatch]:
    """Parse a unified (or git) diff into per-file patches. Raises AdmissionError."""
    if not diff.strip():
        raise AdmissionError("empty_diff", "the diff is empty: a proposal must change something")
    lines = split_lines(diff)
    patches: list[FilePatch] = []
    i = 0
    git_paths: set[str] | None = None
    while i < len(lines):
        named = _check_meta_line(lines[i])
        git_paths = named if named is not None else git_paths
        if _is_file_header(lines, i):
            i, patch = _file_patch(lines, i)
            _check_same_file(git_paths, patch)
            patches.append(patch)
            git_paths = None
            continue
        if HUNK_HEADER.match(lines[i]):
            raise AdmissionError("malformed_diff",
                                 "hunk without a '--- a/file' / '+++ b/file' header")
        i += 1
    if not patches:
        raise AdmissionError("malformed_diff",
                             "no '--- a/file' / '+++ b/file' headers: not a unified diff")
    if all(not p.added and not p.removed for p in patches):
        raise AdmissionError("empty_diff", "the diff changes no lines")
    return patches


def normalize(diff: str) -> str:
    """A canonical form of a diff's changes, for near-duplicate detection."""
    try:
        patches = parse(diff)
    except AdmissionError:
        return diff.strip()
    parts = []
    for p in sorted(patches, key=lambda p: p.path):
        body = "\n".join(["-" + r.rstrip() for r in p.removed] +
                         ["+" + a.rstrip() for a in p.added])
        parts.append(f"{p.path}\n{body}")
    return "\n".join(parts)


# --- reading (a model's answer: forgiving) --------------------------------------------------
def loose_hunks(diff: str) -> list[tuple[str, int, list[str]]]:
    """(path, stated old start line, body lines) per hunk, forgiving counts and blank lines.

    For diffs written by a language model, which are re-anchored by content afterwards.
    """
    out: list[tuple[str, int, list[str]]] = []
    path: str | None = None
    lines = split_lines(diff)
    for i, line in enumerate(lines):
        if line.startswith("+++ ") and i > 0 and lines[i - 1].startswith("--- "):
            raw = line[4:].split("\t")[0].strip()
            path = raw[2:] if raw.startswith(("a/", "b/")) else raw
        elif (m := HUNK_HEADER.match(line)) and path is not None:
            out.append((path, int(m.group(1)), []))
        elif out and line[:1] in (" ", "+", "-", "") and not line.startswith(("--- ", "+++ ")):
            out[-1][2].append(line)
    return out


# --- reading (the dashboard: never raises) --------------------------------------------------
@dataclass(frozen=True)
class DiffLine:
    kind: str  # file | hunk | add | del | ctx | meta
    text: str
    old_no: int | None = None
    new_no: int | None = None


def view_lines(diff: str) -> list[DiffLine]:
    """Typed lines for display, with old/new line numbers. Never raises; unknown lines are
    shown as context."""
    out: list[DiffLine] = []
    old_no = new_no = 0
    lines = split_lines(diff)
    for i, line in enumerate(lines):
        if _is_file_header(lines, i) or (
            line.startswith("+++ ") and i > 0 and lines[i - 1].startswith("--- ")
        ):
            old_no = new_no = 0
            out.append(DiffLine("file", line))
        elif line.startswith(("diff --git", "index ", "\\")):
            out.append(DiffLine("meta", line))
        elif line.startswith("@@"):
            m = HUNK_HEADER.match(line)
            old_no, new_no = (int(m.group(1)), int(m.group(3))) if m else (0, 0)
            out.append(DiffLine("hunk", line))
        elif line.startswith("+"):
            out.append(DiffLine("add", line, None, new_no))
            new_no += 1
        elif line.startswith("-"):
            out.append(DiffLine("del", line, old_no, None))
            old_no += 1
        else:
            out.append(DiffLine("ctx", line, old_no, new_no))
            old_no, new_no = old_no + 1, new_no + 1
    return out


def diff_stats(diff: str) -> tuple[int, int]:
    """(lines added, lines removed), file headers excluded. Never raises."""
    kinds = [line.kind for line in view_lines(diff)]
    return kinds.count("add"), kinds.count("del")


# --- git's own view -------------------------------------------------------------------------
REGULAR_MODES = frozenset({"100644", "100755"})
NO_FILE = "000000"


@dataclass(frozen=True)
class PathChange:
    """One entry of `git diff-tree -r --no-renames -z`: what git actually changed."""

    status: str  # A, D, M, T (type change)
    old_mode: str  # "000000" when added
    new_mode: str  # "000000" when deleted
    path: str


def parse_diff_tree(raw: bytes) -> list[PathChange]:
    """Read `git diff-tree -r --no-renames -z` output (raw format). Paths are decoded as UTF-8
    (undecodable bytes kept as surrogate escapes, so they never match an editable name)."""
    fields = raw.split(b"\0")
    changes = []
    i = 0
    while i + 1 < len(fields) and fields[i].startswith(b":"):
        meta = fields[i][1:].decode("ascii", "replace").split()
        path = fields[i + 1].decode("utf-8", "surrogateescape")
        changes.append(PathChange(meta[4][:1], meta[0], meta[1], path))
        i += 2
    return changes
