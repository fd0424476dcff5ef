"""`overnight adopt PATH`: write an overnight.toml for an existing training repository.

Registers its command on `overnight.cli_common.app` when imported (overnight.cli imports it).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from agent.core.config import CONFIG_FILE, parse_config
from agent.core.errors import ConfigError
from overnight.cli_common import app, console, fail


def _ask(question: str, default: str | None) -> str | None:
    if not sys.stdin.isatty():
        return default
    answer = typer.prompt(question, default=default or "", show_default=bool(default))
    return str(answer).strip() or default


@app.command()
def adopt(
    path: Annotated[Path, typer.Argument(help="an existing git repository with a training script")],
    script: Annotated[str | None, typer.Option(help="the training script (default: found)")] = None,
    metric: Annotated[str | None, typer.Option(help="summary-block key to optimise")] = None,
    direction: Annotated[str | None, typer.Option(help="minimize | maximize")] = None,
    command: Annotated[str | None, typer.Option(help="command run from the repo root")] = None,
    editable: Annotated[list[str] | None, typer.Option(help="a file proposals may change "
                                                       "(repeat the option)")] = None,
    budget: Annotated[float, typer.Option(help="training seconds per run")] = 300.0,
    force: Annotated[bool, typer.Option(help=f"overwrite an existing {CONFIG_FILE}")] = False,
    probe: Annotated[float, typer.Option(
        min=0, help="seconds the command may run once to show what it prints (0: no run)")
    ] = 60.0,
) -> None:
    """Find the training entry point and write overnight.toml (asks when run in a terminal)."""
    from agent.git.repo import GitRepo
    from agent.ops.adopt import adopt as inspect_repo
    from agent.ops.adopt import direction_for, render_toml

    root = path.resolve()
    if not (root / ".git").exists():
        fail(f"{root} is not a git repository: run `git -C {shlex.quote(str(root))} init` and "
             "commit your code first")
    if (root / CONFIG_FILE).exists() and not force:
        fail(f"{root / CONFIG_FILE} exists; pass --force to overwrite it")
    from agent.engine.devices import detect_devices

    if probe and not GitRepo(root).has_ref("HEAD"):
        fail(f"{root} has no commit yet: commit your code first (the probe runs HEAD), or pass "
             "--probe 0")
    try:
        found = inspect_repo(root, Path(script) if script else None, command,
                             has_gpu=bool(detect_devices()), metric=metric, probe_s=probe)
    except ValueError as exc:
        fail(str(exc))
    if found.args_file and (root / found.args_file).exists() and not force:
        fail(f"{root / found.args_file} exists; pass --force to overwrite it")
    chosen = metric or _ask("metric (a key of the script's summary block)", found.metric)
    if not chosen:
        fail("no metric found in the script; pass --metric NAME (the key it prints after ---)")
    way, why = direction_for(chosen)
    found = replace(found, editable=editable or found.editable, metric=chosen,
                    direction=direction or _ask("direction (minimize/maximize)", way) or way,
                    direction_why="as given" if direction else why)
    text = render_toml(found, budget)
    try:
        import tomllib

        parse_config(tomllib.loads(text)["target"])
    except ConfigError as exc:
        fail(f"the {CONFIG_FILE} adopt would write is invalid: {exc}")
    (root / CONFIG_FILE).write_text(text)
    if found.args_file:
        (root / found.args_file).write_text(found.args_text)
    _report(root, found, text)


def _report(root: Path, found, text: str) -> None:  # type: ignore[no-untyped-def]
    console.print(f"wrote {root / CONFIG_FILE}:\n{text}", soft_wrap=True, markup=False)
    if found.args_file:
        console.print(f"wrote {root / found.args_file} (the command's flags, one a line: a "
                      f"sweep may change their numbers):\n{found.args_text}", soft_wrap=True,
                      markup=False)
    console.print(f"direction = {found.direction}: {escape(found.direction_why)}", soft_wrap=True)
    for note in found.notes:
        console.print(f"- {escape(note)}", soft_wrap=True)
    if len(found.commands) > 1:
        console.print(f"the README runs {found.script} in {len(found.commands)} ways; adopt "
                      f"took `{escape(found.full_command)}` (the first, or on a machine without "
                      "a GPU the first that says cpu); pass --command to choose another",
                      soft_wrap=True)
    console.print(f"{found.knobs} knob(s) will be searched"
                  + (f"; {len(found.dead)} dead (something later sets them)" if found.dead
                     else "")
                  + ("" if found.knobs else ": the knobs proposer needs config-block globals, "
                     "argparse defaults, UPPER_CASE constants, dataclass fields, config-file "
                     "keys or args_file lines that nothing later overrides"), soft_wrap=True)
    if found.todo:
        console.print(f"\n[bold]{found.script} still needs, for the contract:[/bold] (each "
                      "line goes in verbatim, as it is after `| `)")
        for item in found.todo:
            console.print(f"- {escape(item)}", soft_wrap=True)
    q = shlex.quote(str(root))
    added = " ".join([CONFIG_FILE, *([found.args_file] if found.args_file else [])])
    console.print(f"\nnext: git -C {q} add {added} && git -C {q} commit -m 'overnight "
                  f"target'\n      overnight doctor --target {q}   (lists every knob: where it "
                  "is set, live or dead)", soft_wrap=True)
