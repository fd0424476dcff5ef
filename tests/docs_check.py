"""Read the documents as a newcomer would copy from them: fenced blocks, shell commands, tables,
inline code and links of README.md and docs/*.md, and check each against the real code.

Every `check_*` function returns a list of problems (empty: fine), each naming the page and what
is wrong, so one test run lists every stale line at once. Shared by tests/test_docs.py.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OVERNIGHT = ("overnight", ".venv/bin/overnight")
SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", "$(", "`"}
REDIRECTS = {">", ">>", "<", "2>", "2>&1"}


@dataclass(frozen=True)
class Block:
    page: str
    lang: str
    text: str
    line: int  # where the block's first line is in the page (1-based)


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a markdown page, with their info string."""
    out, lang, start, body = [], None, 0, []  # type: ignore[var-annotated]
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = re.match(r"^\s*```(\S*)", line)
        if fence and lang is None:
            lang, start, body = fence.group(1), i + 1, []
        elif fence and lang is not None:
            out.append(Block(rel(path), lang, "\n".join(body), start))
            lang = None
        elif lang is not None:
            body.append(line)
    return out


def prose(path: Path) -> str:
    """The page without its fenced blocks."""
    return re.sub(
        r"^\s*```.*?^\s*```[^\n]*$", "", path.read_text(encoding="utf-8"), flags=re.S | re.M
    )


def inline_code(path: Path) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose(path))


# --- shell -----------------------------------------------------------------------------------


def logical_lines(text: str) -> Iterator[str]:
    """A block's lines with `\\` continuations joined and quoted newlines kept inside."""
    pending = ""
    for line in text.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on on the next line
            continue
        yield pending
        pending = ""
    if pending:
        yield pending


def commands(text: str) -> list[list[str]]:
    """Each simple command of a shell block as argv: comments, separators, redirections and
    leading VAR=value assignments removed."""
    out = []
    for line in logical_lines(text):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
        lexer.commenters = "#"
        lexer.whitespace_split = True
        argv: list[str] = []
        tokens = list(lexer)
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok in SEPARATORS or tok.startswith("$("):
                out.append(argv)
                argv = []
            elif tok in REDIRECTS:
                i += 1  # the file it names
            else:
                argv.append(tok)
            i += 1
        out.append(argv)
    cleaned = []
    for argv in out:
        while argv and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0]):
            argv = argv[1:]
        if argv:
            cleaned.append(argv)
    return cleaned


def overnight_argv(argv: list[str]) -> list[str] | None:
    """The `overnight …` command in argv (also after a `--`, as `claude mcp add x -- overnight`)."""
    if argv and argv[0] in OVERNIGHT:
        return argv
    if "--" in argv:
        rest = argv[argv.index("--") + 1 :]
        if rest and rest[0] in OVERNIGHT:
            return rest
    return None


# --- the CLI ---------------------------------------------------------------------------------


def cli() -> Any:
    """The real CLI as its command group (typer's own click: `.commands`, `make_context`)."""
    from overnight.cli import app

    group = typer.main.get_command(app)
    assert hasattr(group, "commands"), group
    return group


def check_command(argv: list[str], where: str, group: Any, full: bool = True) -> list[str]:
    """`overnight SUB ARGS…`: the subcommand exists and click parses ARGS as the real CLI would
    (full), or at least every --flag is one of SUB's options (not full: prose with placeholders)."""
    if len(argv) < 2:
        return []
    sub = group.commands.get(argv[1])
    if sub is None:
        return [
            f"{where}: `{' '.join(argv)}`: no subcommand {argv[1]!r} "
            f"(there are {', '.join(sorted(group.commands))})"
        ]
    if not full:
        known = {o for p in sub.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
        return [
            f"{where}: `{' '.join(argv)}`: `overnight {argv[1]}` has no option {flag}"
            for flag in (a.split("=")[0] for a in argv[2:] if a.startswith("--"))
            if flag not in known
        ]
    try:
        sub.make_context(argv[1], list(argv[2:]), resilient_parsing=False)
    except typer.Exit:  # --help
        return []
    except typer.TyperException as exc:  # click's UsageError and BadParameter
        return [f"{where}: `{' '.join(argv)}`: {exc.format_message()}"]
    return []


def check_shell_blocks(group: Any) -> list[str]:
    problems = []
    dev_sh = (ROOT / "dev.sh").read_text()
    dev_commands = set(re.findall(r"^\s*(\w+)\)", dev_sh, flags=re.M))
    for page in PAGES:
        for block in blocks(page):
            if block.lang not in ("bash", "sh", "shell"):
                continue
            where = f"{block.page}:{block.line}"
            for argv in commands(block.text):
                if argv[0] == "./dev.sh" and (len(argv) < 2 or argv[1] not in dev_commands):
                    problems.append(f"{where}: `{' '.join(argv)}`: dev.sh has {dev_commands}")
                found = overnight_argv(argv)
                if found:
                    problems += check_command(found, where, group)
    return problems


def check_inline_commands(group: Any) -> list[str]:
    """`overnight SUB --flag …` in the prose: the subcommand and its flags exist."""
    problems = []
    for page in PAGES:
        for code in inline_code(page):
            if not code.startswith("overnight "):
                continue
            try:
                argv = shlex.split(code.replace("…", ""))
            except ValueError:
                argv = code.split()
            problems += check_command(argv, rel(page), group, full=False)
    return problems


# --- tables ----------------------------------------------------------------------------------


def tables(path: Path) -> list[list[list[str]]]:
    """Each markdown table of a page as rows of cells (the header row first, no separator)."""
    out: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in prose(path).splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                current.append(cells)
        elif current:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def table(path: Path, header: str) -> list[list[str]]:
    """The body rows of the page's table whose first header cell is `header`."""
    found = [t for t in tables(path) if t and t[0][0] == header]
    assert len(found) == 1, f"{rel(path)}: expected one table headed {header!r}"
    return found[0][1:]


def code_of(cell: str) -> str | None:
    """The cell's text when it is one code span (`like this`), else None."""
    m = re.fullmatch(r"`([^`]+)`", cell)
    return m.group(1) if m else None


def check_key_table(
    path: Path, model: Any, minimal: dict[str, Any], required: set[str], header: str = "key"
) -> list[str]:
    """The `key | default | …` table (the one whose first header is `header`) names exactly
    the model's fields (but `minimal`'s own extras), says `required` of exactly the required
    ones, and each default given as one TOML literal is the one the model fills in (as it
    serializes it)."""
    problems = []
    rows = table(path, header)
    keys = [code_of(r[0]) for r in rows]
    fields = set(model.model_fields) - (set(minimal) - required)
    name = model.__name__
    for key in sorted(set(keys) - fields, key=str):
        problems.append(f"{rel(path)}: documents key {key!r}, which {name} does not accept")
    for key in sorted(fields - set(keys)):
        problems.append(f"{rel(path)}: key {key!r} of {name} is not documented")
    defaults = model.model_validate(minimal).model_dump(mode="json")
    for row, key in zip(rows, keys, strict=True):
        if key not in fields:
            continue
        if (row[1] == "required") != (key in required):
            problems.append(
                f"{rel(path)}: {key} is {'' if key in required else 'not '}"
                f"required, the page says {row[1]!r}"
            )
        literal = code_of(row[1])
        if literal is not None and tomllib.loads(f"v = {literal}")["v"] != defaults[key]:
            problems.append(
                f"{rel(path)}: {key} default documented {literal}, the code has {defaults[key]!r}"
            )
    return problems


# --- toml ------------------------------------------------------------------------------------


def check_toml_blocks(tmp: Path, group: Any) -> list[str]:
    """overnight.toml blocks load through the real loader; LLM profiles parse; an MCP client's
    overnight command parses."""
    from agent.core.config import load_config
    from agent.core.errors import ConfigError
    from agent.proposers.llm_backends import parse_profile

    problems = []
    for page in PAGES:
        for n, block in enumerate(b for b in blocks(page) if b.lang == "toml"):
            where = f"{block.page}:{block.line}"
            try:
                data = tomllib.loads(block.text)
                if "target" in data:
                    folder = tmp / f"{page.stem}-{n}"
                    folder.mkdir()
                    (folder / "overnight.toml").write_text(block.text)
                    load_config(folder)
                elif "profiles" in data:
                    for name, table_ in data["profiles"].items():
                        parse_profile(name, table_, source=where)
                elif "notify" in data:  # a notify file (agent/ops/notify.py)
                    from agent.ops.notify import load_notify_config

                    file = tmp / f"{page.stem}-{n}-notify.toml"
                    file.write_text(block.text)
                    load_notify_config(file)
                elif "mcp_servers" in data:
                    for server in data["mcp_servers"].values():
                        if server.get("command") in OVERNIGHT:
                            problems += check_command(
                                [server["command"], *server["args"]], where, group
                            )
                else:
                    problems.append(f"{where}: a toml block of no known kind: {sorted(data)}")
            except (tomllib.TOMLDecodeError, ConfigError) as exc:
                problems.append(f"{where}: {exc}")
    return problems


# --- REST ------------------------------------------------------------------------------------


def api_routes() -> dict[tuple[str, str], Any]:
    """(METHOD, path) of every public REST route, with the route."""
    from api.routes import experiments, sweeps, system

    out = {}
    for module in (system, sweeps, experiments):
        for route in module.router.routes:
            if getattr(route, "include_in_schema", False):
                for method in route.methods:  # type: ignore[attr-defined]
                    out[(method, route.path)] = route  # type: ignore[attr-defined]
    return out


def dashboard_paths() -> set[str]:
    from api.dashboard import routes as dashboard

    found = set()
    for r in (*dashboard.router.routes, *dashboard.pages.routes, *dashboard.json.routes):
        if hasattr(r, "path"):
            found.add(re.sub(r"\{(\w+)(:\w+)?\}", r"{\1}", r.path))
    return found


def _route_for(method: str, path: str, routes: dict[tuple[str, str], Any]) -> Any | None:
    for (m, template), route in routes.items():
        pattern = re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(template))
        if m == method and re.fullmatch(pattern, path):
            return route
    return None


def body_model(route: Any) -> type | None:
    import typing

    from pydantic import BaseModel

    for hint in typing.get_type_hints(route.endpoint).values():
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            return hint
    return None


def check_curl(argv: list[str], where: str, routes: dict[tuple[str, str], Any]) -> list[str]:
    """A documented `curl` names a route that exists, and its JSON body is one it accepts."""
    from pydantic import ValidationError

    url = next(
        (a for a in argv if re.match(r"^(https?://)?(localhost|127\.0\.0\.1):\d+/", a)), None
    )
    if url is None:
        return []
    method = argv[argv.index("-X") + 1] if "-X" in argv else ("POST" if "-d" in argv else "GET")
    path = re.sub(r"^(https?://)?[^/]+", "", url).split("?")[0]
    if path == "/mcp":
        return []
    route = _route_for(method, path, routes)
    if route is None:
        return [f"{where}: `curl -X {method} {path}`: no such route"]
    if "-d" not in argv:
        return []
    model = body_model(route)
    try:
        assert model is not None, f"{method} {path} takes no body"
        model.model_validate(json.loads(argv[argv.index("-d") + 1]))  # type: ignore[attr-defined]
    except (AssertionError, ValueError, ValidationError) as exc:
        return [f"{where}: the body of `curl -X {method} {path}` is refused: {exc}"]
    return []


def check_curls(routes: dict[tuple[str, str], Any]) -> list[str]:
    problems = []
    for page in PAGES:
        for block in blocks(page):
            if block.lang == "bash":
                for argv in commands(block.text):
                    if argv[0] == "curl":
                        problems += check_curl(argv, f"{block.page}:{block.line}", routes)
    return problems


# --- names that must exist -------------------------------------------------------------------

TOP = (
    "agent/",
    "api/",
    "db/",
    "overnight/",
    "runner/",
    "tests/",
    "benchmarks/",
    "experiments/",
    "docker/",
    "docs/",
)


def source_text() -> str:
    """Every tracked file but the documents themselves: where a name the docs use must occur."""
    import subprocess

    names = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return "\n".join(
        (ROOT / n).read_text(errors="replace")
        for n in names
        if not n.endswith(".md") and (ROOT / n).is_file()
    )


def check_names(source: str) -> list[str]:
    """Paths, test names and OVERNIGHT_* variables named in the docs exist."""
    problems = []
    tests = (ROOT / "tests").glob("test_*.py")
    defined = set(
        re.findall(r"^\s*def (test_\w+)", "\n".join(t.read_text() for t in tests), flags=re.M)
    )
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for var in sorted(set(re.findall(r"\bOVERNIGHT_[A-Z_]*[A-Z]\b", text))):
            if var not in source:
                problems.append(f"{rel(page)}: {var} appears nowhere in the code")
        for code in inline_code(page) + re.findall(r"\(\.\./([^)#\s]+)\)", text):
            path = code.split()[0].rstrip(":,")
            looks_like_a_path = (
                path.startswith(TOP)
                and not re.search(r"[<*{…]", path)
                and re.search(r"(/|\.\w+)$", path)
            )  # a folder/ or a file.ext, not a branch
            if looks_like_a_path and not (ROOT / path).exists():
                problems.append(f"{rel(page)}: `{path}` does not exist")
            if re.fullmatch(r"test_\w+\*?", code):
                stem = code.rstrip("*")
                exists = (
                    any(d.startswith(stem) for d in defined)
                    if code.endswith("*")
                    else stem in defined
                )
                if not exists:
                    problems.append(f"{rel(page)}: no test named {code}")
            if re.fullmatch(r"test_\w+\.py", code) and not (ROOT / "tests" / code).exists():
                problems.append(f"{rel(page)}: no tests/{code}")
    return problems


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#+ (.+)$", prose(path), flags=re.M)}


def check_links() -> list[str]:
    """Every relative link resolves to a file, and its #anchor to a heading there."""
    problems = []
    for page in [*PAGES, ROOT / "benchmarks" / "README.md", ROOT / "docker" / "README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(page)):
            if re.match(r"^[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                problems.append(f"{rel(page)}: link to {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{rel(page)}: link to {target}: no such heading")
    return problems


def check_code_references() -> list[str]:
    """Messages and docstrings in the product that send a reader to a page (`see docs/x.md
    'Heading'`, `README, "Heading"`) name a page and heading that exist."""
    problems = []
    for py in sorted(ROOT.glob("*/**/*.py")):
        if py.parts[len(ROOT.parts)] in ("tests", ".venv"):
            continue
        text = re.sub(r'"\s*\n\s*"', "", py.read_text())  # adjacent literals: one string
        for page, heading in re.findall(
            r"\b(README(?:\.md)?|docs/[\w-]+\.md),? [\"']([^\"'\n]+)[\"']", text
        ):
            page = "README.md" if page.startswith("README") else page
            if not (ROOT / page).exists() or slug(heading) not in anchors(ROOT / page):
                problems.append(f"{rel(py)}: refers to {page} '{heading}', which does not exist")
    return problems


def check_benchmark_commands() -> list[str]:
    """Each command in benchmarks/README.md runs a script that exists, with flags it defines."""
    problems = []
    page = ROOT / "benchmarks" / "README.md"
    for row in table(page, "what"):
        codes = re.findall(r"`([^`]+)`", row[1])
        scripts = [m for c in codes for m in re.findall(r"benchmarks/[\w.]+\.(?:py|sh)", c)]
        for script in scripts:
            if not (ROOT / script).is_file():
                problems.append(f"{rel(page)}: {script} does not exist")
        if not scripts or not (ROOT / scripts[0]).is_file():
            continue
        source = (ROOT / scripts[0]).read_text()
        for flag in (f for c in codes for f in re.findall(r"(?<!\S)(--[\w-]+)", c)):
            if f'"{flag}"' not in source:
                problems.append(f"{rel(page)}: {scripts[0]} has no option {flag}")
    return problems
