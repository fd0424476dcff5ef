"""Read git's own files in-process: a branch's commit (loose refs, packed-refs) and an index.

For the admission fast path (agent.git.repo): answering "which commit is this branch at" and
"what did `git apply --cached` change in this index" without starting a git process. Stdlib
only. Guaranteed: every reader returns None for anything it does not fully understand (a
reftable repository, a symbolic ref, index version 4, a split index, conflict stages, an
unexpected layout), and the caller then asks git itself; a value returned is what git would
answer (`rev-parse --verify refs/heads/<branch>`, `diff-tree -r --no-renames` of two trees).
Hand-written rather than gitpython's IndexFile: it reads SHA-1 indexes only, decodes paths as
text, and takes a split index's own entries for the whole index without saying so.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

from agent.core.diff import NO_FILE, PathChange

_HEX = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")
_SAFE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
# Where `rev-parse <name>` looks before refs/heads/<name> (git's DWIM order, gitrevisions(7)).
_EARLIER = ("{}", "refs/{}", "refs/tags/{}")
_ENTRY_FIXED = 62 - 20  # stat fields (40 bytes) + flags (2 bytes); the hash length varies
_STAGE_MASK, _EXTENDED, _NAME_MASK = 0x3000, 0x4000, 0x0FFF
_TYPE_MASK = 0o170000

IndexEntries = dict[bytes, tuple[int, bytes]]  # path -> (mode, object id)


def is_object_id(text: str) -> bool:
    """A full SHA-1 or SHA-256 object id in lower-case hex."""
    return bool(_HEX.match(text))


def _packed_refs(common_dir: Path) -> dict[str, str] | None:
    try:
        text = (common_dir / "packed-refs").read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError):
        return None
    refs = {}
    for line in text.splitlines():
        if line and line[0] not in "#^":
            sha, _, name = line.partition(" ")
            refs[name] = sha
    return refs


def _loose_ref(root: Path, name: str) -> str | None:
    """The loose ref file's content, "" when absent; None when it is not a plain sha."""
    try:
        text = (root / name).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return ""
    except (OSError, UnicodeDecodeError):
        return None
    return text if is_object_id(text) else None


def branch_commit(git_dir: Path, common_dir: Path, ref: str) -> str | None:
    """The commit `rev-parse --verify <ref>` names when that resolves to a branch
    (`refs/heads/<name>`, or `<name>` with nothing of that name found first).

    None when git must answer: an unusual name, a symbolic or unreadable ref, a reftable
    repository, or a ref that `rev-parse` would find before the branch (a tag of that name).
    """
    branch = ref.removeprefix("refs/heads/")
    if not _SAFE_REF.match(branch) or ".." in branch or branch.endswith((".lock", "/")):
        return None
    if not (common_dir / "refs").is_dir() or (common_dir / "reftable").exists():
        return None
    packed = _packed_refs(common_dir)
    if packed is None:
        return None
    for pattern in _EARLIER if branch == ref else ():
        name = pattern.format(branch)
        root = git_dir if name == branch else common_dir
        if _loose_ref(root, name) != "" or name in packed:
            return None  # something rev-parse finds first (or cannot be read here)
    loose = _loose_ref(common_dir, f"refs/heads/{branch}")
    if loose is None:
        return None
    return loose or packed.get(f"refs/heads/{branch}")


def read_index(data: bytes, hash_len: int) -> IndexEntries | None:
    """Stage-0 entries of an index file (versions 2 and 3); None for anything else."""
    if len(data) < 12 or data[:4] != b"DIRC":
        return None
    version, count = struct.unpack(">II", data[4:12])
    if version not in (2, 3):
        return None
    entries: IndexEntries = {}
    pos = 12
    for _ in range(count):
        head_end = pos + _ENTRY_FIXED + hash_len
        if head_end > len(data):
            return None
        mode = struct.unpack(">I", data[pos + 24:pos + 28])[0]
        oid = data[pos + 40:pos + 40 + hash_len]
        (flags,) = struct.unpack(">H", data[head_end - 2:head_end])
        if flags & _STAGE_MASK:
            return None  # a conflict: never written by apply, so not ours to read
        name_start = head_end + (2 if flags & _EXTENDED else 0)
        name_end = data.find(b"\0", name_start)
        if name_end < 0:
            return None
        entries[data[name_start:name_end]] = (mode, oid)
        pos += ((name_end - pos) // 8 + 1) * 8  # 1-8 NULs pad an entry to a multiple of 8
    return entries if _extensions_ok(data, pos, hash_len) else None


def _extensions_ok(data: bytes, pos: int, hash_len: int) -> bool:
    """Refuse a split index ("link") or a sparse one: their entries are not all here."""
    end = len(data) - hash_len
    while pos + 8 <= end:
        sig, size = data[pos:pos + 4], struct.unpack(">I", data[pos + 4:pos + 8])[0]
        if sig in (b"link", b"sdir"):
            return False
        pos += 8 + size
    return pos == end


def _mode(mode: int | None) -> str:
    return NO_FILE if mode is None else f"{mode:06o}"


def _status(old: int | None, new: int | None) -> str:
    if old is None:
        return "A"
    if new is None:
        return "D"
    return "T" if old & _TYPE_MASK != new & _TYPE_MASK else "M"


def index_changes(before: IndexEntries, after: IndexEntries) -> list[PathChange]:
    """What `diff-tree -r --no-renames` reports between the trees of two indexes."""
    changes = []
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        old_mode, new_mode = (old[0] if old else None), (new[0] if new else None)
        changes.append(PathChange(_status(old_mode, new_mode), _mode(old_mode), _mode(new_mode),
                                  path.decode("utf-8", "surrogateescape")))
    return changes
