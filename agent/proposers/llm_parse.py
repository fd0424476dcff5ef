"""Turn a model's answer into one description and a clean unified diff. Pure.

Accepted answer shapes, tried in this order: the JSON edit (agent.proposers.llm_formats),
SEARCH/REPLACE blocks, a unified diff (fenced or bare; hunks are re-anchored by their content,
so wrong line numbers are forgiven), a full file in a fenced block — only when it is plausibly
the whole file (it keeps WHOLE_FILE_KEEPS of the file's lines; a fragment is refused, labelled
or not). Whatever the shape, the result is applied to the current files in memory and
re-emitted with difflib, so the diff always matches the files the model was shown. Every
failure raises AdmissionError with a message meant for the model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from difflib import SequenceMatcher

from agent.core.diff import files_diff, lines_with_ends, loose_hunks, make_diff, split_lines
from agent.core.errors import AdmissionError
from agent.proposers.llm_formats import apply_edits, json_answer

__all__ = ["ParsedAnswer", "apply_unified_diff", "description_of", "extract_diff_text",
           "files_diff", "make_diff", "parse_answer"]

_DESC = re.compile(r"^\W{0,4}description\W{0,4}\s*[:\-]\s*(.+)$", re.I | re.M)
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
_SR = re.compile(r"^<{5,9} ?SEARCH[ \t]*\n(.*?)^={5,9}[ \t]*\n(.*?)^>{5,9} ?REPLACE[ \t]*$",
                 re.S | re.M)
_DIFF_START = re.compile(r"^(diff --git |--- )", re.M)
WHOLE_FILE_KEEPS = 0.75  # of the file's lines a whole-file answer must keep unchanged


@dataclass(frozen=True)
class ParsedAnswer:
    description: str
    diff: str  # clean unified diff against the files shown
    shape: str  # "json_edit" | "search_replace" | "unified_diff" | "full_file"
    category: str | None = None  # as the JSON answer stated it


def description_of(text: str) -> str | None:
    m = _DESC.search(text)
    if m:
        return _clean(m.group(1))
    outside = _FENCE.sub("", text)
    for line in outside.splitlines():
        line = _clean(line)
        if line and not line.startswith(("<<<", "===", ">>>", "---", "+++", "@@")):
            return line
    return None


def _clean(line: str) -> str:
    return " ".join(line.strip().strip("*#`>_ ").split())[:200]


def _path_for(label: str, files: dict[str, str]) -> str | None:
    """An editable path named in a label line ("train.py", "FILE: `train.py`", "### train.py")."""
    words = re.findall(r"[\w./-]+", label)
    for word in reversed(words):
        word = word.removeprefix("a/").removeprefix("b/")
        if word in files:
            return str(word)
    return None


# --- search/replace -------------------------------------------------------------------------
def _replace_once(content: str, search: str, replace: str, path: str) -> str:
    if not search.strip():
        raise AdmissionError("bad_search", f"an empty SEARCH section for {path}: copy the exact "
                             "lines to change into SEARCH")
    count = content.count(search)
    if count == 1:
        return content.replace(search, replace, 1)
    if count > 1:
        raise AdmissionError("bad_search", f"the SEARCH text matches {count} places in {path}; "
                             "include more surrounding lines so it is unique")
    # Forgive trailing-whitespace differences, line by line.
    lines = lines_with_ends(content)
    want = [s.rstrip() for s in split_lines(search)]
    hits = [i for i in range(len(lines) - len(want) + 1)
            if [x.rstrip() for x in lines[i:i + len(want)]] == want]
    if len(hits) != 1:
        first = search.strip().splitlines()[0][:80]
        raise AdmissionError("bad_search", f"the SEARCH text starting {first!r} was not found "
                             f"exactly in {path}; copy the lines verbatim from the file shown")
    i = hits[0]
    new = replace if replace.endswith("\n") or not replace else replace + "\n"
    return "".join(lines[:i]) + new + "".join(lines[i + len(want):])


def apply_search_replace(text: str, files: dict[str, str]) -> dict[str, str]:
    out = dict(files)
    for m in _SR.finditer(text):
        before = text[:m.start()].rstrip("\n").splitlines()
        label = next((ln for ln in reversed(before) if ln.strip() and not ln.startswith("```")), "")
        path = _path_for(label, files) or (next(iter(files)) if len(files) == 1 else None)
        if path is None:
            raise AdmissionError("bad_search", "put the file's path on the line just above "
                                 f"<<<<<<< SEARCH (editable: {', '.join(sorted(files))})")
        out[path] = _replace_once(out[path], m.group(1), m.group(2), path)
    return out


# --- unified diff ---------------------------------------------------------------------------
def extract_diff_text(text: str) -> str | None:
    for m in _FENCE.finditer(text):
        if _DIFF_START.search(m.group(2)) and "\n+++ " in "\n" + m.group(2):
            return m.group(2)
    start = _DIFF_START.search(text)
    return text[start.start():] if start and "\n+++ " in text[start.start():] else None


def _apply_hunk(content: str, line_no: int, body: list[str], path: str) -> str:
    old = [b[1:] for b in body if b[:1] in (" ", "-") or b == ""]
    new = [b[1:] for b in body if b[:1] in (" ", "+") or b == ""]
    while old and new and old[-1] == "" and new[-1] == "" and body and body[-1] == "":
        old.pop(), new.pop(), body.pop()  # a blank line the model left after the hunk
    lines = split_lines(content)
    if not old:
        at = max(0, min(line_no, len(lines)))
        return "\n".join(lines[:at] + new + lines[at:]) + "\n"
    norm = [x.rstrip() for x in old]
    hits = [i for i in range(len(lines) - len(old) + 1)
            if [x.rstrip() for x in lines[i:i + len(old)]] == norm]
    if not hits:
        first = next((x for x in old if x.strip()), old[0])[:80]
        raise AdmissionError("does_not_apply", f"a hunk of the diff for {path} does not match the "
                             f"file (context starting {first!r} not found): diff against the "
                             "exact current file shown")
    at = min(hits, key=lambda i: abs(i + 1 - line_no))
    return "\n".join(lines[:at] + new + lines[at + len(old):]) + "\n"


def apply_unified_diff(diff: str, files: dict[str, str]) -> dict[str, str]:
    hunks = loose_hunks(diff)
    if not hunks:
        raise AdmissionError("malformed_diff", "the diff has no '--- a/file', '+++ b/file' and "
                             "'@@' hunk lines")
    out = dict(files)
    for path, line_no, body in hunks:
        if path not in out:
            raise AdmissionError("not_editable", f"{path} is not editable (editable files: "
                                 f"{', '.join(sorted(files))})")
        out[path] = _apply_hunk(out[path], line_no, body, path)
    return out


# --- full file ------------------------------------------------------------------------------
def _kept_lines(body: str, original: str) -> int:
    old, new = split_lines(original), split_lines(body)
    return sum(b.size for b in SequenceMatcher(None, old, new, autojunk=False)
               .get_matching_blocks())


def _whole_file(body: str, original: str, path: str) -> None:
    """Refuse a block that is not plausibly the whole file with one change."""
    total = len(split_lines(original))
    kept = _kept_lines(body, original)
    if kept < WHOLE_FILE_KEEPS * total:
        raise AdmissionError("not_whole_file", f"the code block for {path} keeps only {kept} "
                             f"of the file's {total} lines, so it is not the whole file: send "
                             "the change as a diff or SEARCH/REPLACE, not a fragment")


def full_file(text: str, files: dict[str, str]) -> dict[str, str] | None:
    out = dict(files)
    found = False
    for m in _FENCE.finditer(text):
        info, body = m.group(1).strip(), m.group(2)
        before = text[:m.start()].rstrip("\n").splitlines()
        label = before[-1] if before else ""
        path = _path_for(info, files) or _path_for(label, files)
        if path is None and len(files) == 1:
            path = next(iter(files))
        if path is not None:
            _whole_file(body, files[path], path)
            out[path], found = body, True
    return out if found else None


def parse_answer(text: str, files: dict[str, str]) -> ParsedAnswer:
    """One description + clean diff from a model answer. Raises AdmissionError."""
    data = json_answer(text)
    if data is not None:
        edited = files_diff(files, apply_edits(data, files))
        if not edited:
            raise AdmissionError("empty_diff", "the edits leave the files exactly as they are: "
                                 "'replace' must differ from 'search'")
        stated = data.get("description")
        description = _clean(stated) if isinstance(stated, str) and _clean(stated) else (
            "change proposed by the LLM")
        category = data.get("category")
        return ParsedAnswer(description, edited, "json_edit",
                            category if isinstance(category, str) else None)
    if _SR.search(text):
        after, shape = apply_search_replace(text, files), "search_replace"
    elif (diff := extract_diff_text(text)) is not None:
        after, shape = apply_unified_diff(diff, files), "unified_diff"
    elif (whole := full_file(text, files)) is not None:
        after, shape = whole, "full_file"
    else:
        raise AdmissionError("no_diff", "no change found in the answer: reply with a "
                             "DESCRIPTION: line and a unified diff in a ```diff block (or "
                             "SEARCH/REPLACE blocks)")
    diff = files_diff(files, after)
    if not diff:
        raise AdmissionError("empty_diff", "the change leaves the files exactly as they are")
    description = description_of(text) or "change proposed by the LLM"
    return ParsedAnswer(description=description, diff=diff, shape=shape)
