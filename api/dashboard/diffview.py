"""Split a unified diff into typed lines for the templates (file headers, hunks, +/-, context).

Pure: stdlib only. Never raises on any input text; unknown lines render as context.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DiffLine:
    kind: str  # file | hunk | add | del | ctx | meta
    text: str
    old_no: int | None = None
    new_no: int | None = None


def _hunk_start(line: str) -> tuple[int, int]:
    """`@@ -12,3 +12,4 @@` → (12, 12); (0, 0) if the header is malformed."""
    try:
        old, new = line.split("@@")[1].split()[:2]
        return int(old[1:].split(",")[0]), int(new[1:].split(",")[0])
    except (IndexError, ValueError):
        return 0, 0


def parse_diff(diff: str) -> list[DiffLine]:
    out: list[DiffLine] = []
    old_no = new_no = 0
    lines = diff.splitlines()
    for i, line in enumerate(lines):
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if (line.startswith("--- ") and nxt.startswith("+++ ")) or (
            line.startswith("+++ ") and i > 0 and lines[i - 1].startswith("--- ")
        ):
            old_no = new_no = 0
            out.append(DiffLine("file", line))
        elif line.startswith("diff --git") or line.startswith("index "):
            old_no = new_no = 0
            out.append(DiffLine("meta", line))
        elif line.startswith("@@"):
            old_no, new_no = _hunk_start(line)
            out.append(DiffLine("hunk", line))
        elif line.startswith("+"):
            out.append(DiffLine("add", line, None, new_no))
            new_no += 1
        elif line.startswith("-"):
            out.append(DiffLine("del", line, old_no, None))
            old_no += 1
        elif line.startswith("\\"):
            out.append(DiffLine("meta", line))
        else:
            out.append(DiffLine("ctx", line, old_no, new_no))
            old_no += 1
            new_no += 1
    return out


def diff_stats(diff: str) -> tuple[int, int]:
    """(lines added, lines removed), file headers excluded."""
    added = removed = 0
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++ "):
            added += 1
        elif line.startswith("-") and not line.startswith("--- "):
            removed += 1
    return added, removed
