"""The structured answer: a JSON edit under a schema, how each API is asked for it, and how it
is read back into files. Pure.

The edit is a description, a category and a short list of search/replace edits. Where the
editable files are small enough, `search` is an enum of the files' unique lines, so a server
that enforces the schema by grammar (llama.cpp, vLLM) can only name a line that exists: the
answer is well-formed by construction and admission, not parsing, judges it. The ways to ask:
OpenAI's `response_format` json_schema, the `json_object` + `schema` form (llama-cpp-python,
llama.cpp), a forced tool call (OpenAI tools, Anthropic tool_use); "text" asks for none.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agent.core.diff import lines_with_ends
from agent.core.errors import AdmissionError
from agent.rules.categories import CATEGORY_VALUES

TOOL_NAME = "propose_experiment"
OPENAI_AUTO = ("json_schema", "json_object", "tools", "text")  # tried in this order
ANTHROPIC_AUTO = ("tools", "text")
MAX_EDITS = 3
DESCRIPTION_CHARS = 160
REPLACE_CHARS = 600
ENUM_MAX_LINES = 600  # beyond this the search line is free text (grammars and APIs have limits)
ENUM_MAX_CHARS = 40_000
_FENCED_JSON = re.compile(r"^\s*```(?:json)?\s*\n(.*?)\n```\s*$", re.S)


def search_lines(files: dict[str, str]) -> list[str]:
    """The lines that occur exactly once in their file (trailing whitespace dropped), less
    those with a double quote or a backslash: llama-cpp-python 0.3.36 turns such an enum value
    into a grammar it cannot parse, and its server dies of it."""
    out: list[str] = []
    for _, text in sorted(files.items()):
        lines = [ln.rstrip() for ln in text.splitlines()]
        counts: dict[str, int] = {}
        for ln in lines:
            counts[ln] = counts.get(ln, 0) + 1
        out += [ln for ln in lines if ln.strip() and counts[ln] == 1 and ln not in out
                and '"' not in ln and "\\" not in ln]
    return out


def edit_schema(files: dict[str, str]) -> dict[str, Any]:
    """The JSON schema of one proposal against these files."""
    lines = search_lines(files)
    search: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 2000,
                              "description": "the exact existing line(s) to replace"}
    if lines and len(lines) <= ENUM_MAX_LINES and sum(map(len, lines)) <= ENUM_MAX_CHARS:
        search = {"type": "string", "enum": lines,
                  "description": "one existing line of the file, copied exactly"}
    edit = {"type": "object", "additionalProperties": False,
            "required": ["path", "search", "replace"],
            "properties": {"path": {"type": "string", "enum": sorted(files)},
                           "search": search,
                           "replace": {"type": "string", "maxLength": REPLACE_CHARS,
                                       "description": "the new text for those lines"}}}
    return {"type": "object", "additionalProperties": False,
            "required": ["description", "category", "edits"],
            "properties": {
                "description": {"type": "string", "minLength": 3,
                                "maxLength": DESCRIPTION_CHARS,
                                "description": "one line: what changes and why"},
                "category": {"type": "string", "enum": list(CATEGORY_VALUES)},
                "edits": {"type": "array", "minItems": 1, "maxItems": MAX_EDITS,
                          "items": edit}}}


def ask_body(answer_format: str, schema: dict[str, Any] | None) -> dict[str, Any]:
    """The chat-completions request keys that ask for the JSON edit in `answer_format`."""
    if schema is None or answer_format == "text":
        return {}
    if answer_format == "json_schema":
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "experiment", "schema": schema}}}
    if answer_format == "json_object":
        return {"response_format": {"type": "json_object", "schema": schema}}
    return {"tools": [{"type": "function", "function": {
                "name": TOOL_NAME, "description": "Propose one experiment.",
                "parameters": schema}}],
            "tool_choice": {"type": "function", "function": {"name": TOOL_NAME}}}


def read_choice(choice: dict[str, Any]) -> str:
    """A chat completion's answer text: a forced tool call's arguments, else the content."""
    message = choice["message"]
    calls = message.get("tool_calls") or []
    if calls and calls[0].get("function", {}).get("arguments"):
        args = calls[0]["function"]["arguments"]
        return args if isinstance(args, str) else json.dumps(args)
    return str(message.get("content") or "")


def read_tool_use(blocks: list[dict[str, Any]]) -> str:
    """An Anthropic answer: the forced tool's input as JSON, else the text blocks."""
    for block in blocks:
        if block.get("type") == "tool_use" and isinstance(block.get("input"), dict):
            return json.dumps(block["input"])
    return "".join(b.get("text", "") for b in blocks if b.get("type") == "text")


def json_answer(text: str) -> dict[str, Any] | None:
    """The answer's JSON object (bare or in one fenced block; text after it is ignored: a
    grammar-bound server was seen to run on past the object), None when it is not one."""
    raw = text.strip()
    m = _FENCED_JSON.match(raw)
    raw = m.group(1) if m else raw
    if not raw.startswith("{"):
        return None
    try:
        data, _ = json.JSONDecoder(strict=False).raw_decode(raw)  # raw newlines in strings
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def apply_edits(data: dict[str, Any], files: dict[str, str]) -> dict[str, str]:
    """The files after the JSON answer's edits, each found in the files as shown (so two
    edits cannot step on each other; an edit repeated counts once, two different edits of one
    line are refused). Raises AdmissionError naming the bad edit."""
    edits = data.get("edits")
    if not isinstance(edits, list) or not edits:
        raise AdmissionError("bad_edit", "the JSON answer has no 'edits' list: give at least "
                             "one {path, search, replace}")
    placed: dict[str, list[tuple[int, int, str, int]]] = {}
    seen: list[Any] = []
    for n, edit in enumerate(edits[:MAX_EDITS], 1):
        if edit in seen:  # the same edit twice (small models do) is that edit once
            continue
        seen.append(edit)
        if not isinstance(edit, dict) or not all(isinstance(edit.get(k), str)
                                                 for k in ("search", "replace")):
            raise AdmissionError("bad_edit", f"edit {n} needs string 'search' and 'replace'")
        path = edit.get("path") if edit.get("path") in files else (
            next(iter(files)) if len(files) == 1 else None)
        if path is None:
            raise AdmissionError("not_editable", f"edit {n}: {edit.get('path')!r} is not "
                                 f"editable (editable: {', '.join(sorted(files))})")
        at, count = _find(files[path], edit["search"], path, n)
        for other_at, other_count, _, m in placed.get(path, []):
            if at < other_at + other_count and other_at < at + count:
                raise AdmissionError("bad_edit", f"edits {m} and {n} change the same line of "
                                     f"{path}: give each line one edit")
        placed.setdefault(path, []).append((at, count, edit["replace"], n))
    out = dict(files)
    for path, spots in placed.items():
        lines = lines_with_ends(files[path])
        for at, count, replace, _ in sorted(spots, reverse=True):  # bottom up: indexes hold
            lines[at:at + count] = _new_lines(lines[at], replace)
        out[path] = "".join(lines)
    return out


def _find(content: str, search: str, path: str, n: int) -> tuple[int, int]:
    """Where `search` (whole lines, trailing whitespace forgiven) is in content, exactly once."""
    want = [s.rstrip() for s in search.strip("\n").split("\n")]
    lines = lines_with_ends(content)
    hits = [i for i in range(len(lines) - len(want) + 1)
            if [x.rstrip() for x in lines[i:i + len(want)]] == want]
    if len(hits) != 1:
        where = "was not found" if not hits else f"matches {len(hits)} places"
        raise AdmissionError("bad_search", f"edit {n}: the search text {want[0][:80]!r} {where} "
                             f"in {path}; copy one existing line exactly")
    return hits[0], len(want)


def _new_lines(first: str, replace: str) -> list[str]:
    """The replacement lines, indented like the line they replace when the model left the
    indentation out."""
    indent = first[:len(first) - len(first.lstrip())]
    new = replace.strip("\n").split("\n") if replace.strip() else []
    if indent and new and not new[0][:1].isspace():
        new = [indent + ln if ln.strip() else ln for ln in new]
    return [ln + "\n" for ln in new]
