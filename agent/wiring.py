"""Where the object graph is built for the CLI: database, store, repo, runner, proposer."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.errors import ConfigError
from agent.ports import Proposer
from runner.process import run_command
from runner.result import RunResult

DEFAULT_HOME = Path("~/.overnight")


def default_db() -> Path:
    return Path(os.environ.get("OVERNIGHT_DB") or DEFAULT_HOME / "overnight.db").expanduser()


def work_dir_for(db_path: Path) -> Path:
    """Worktrees and logs live beside the database, in `<db>.work/` (like `<db>.lock` and
    `<db>.token`), so two databases in one folder never share or prune each other's runs."""
    db = Path(db_path).expanduser().resolve()
    return db.with_name(db.name + ".work")


class SubprocessRunner:
    """The Runner port on runner.process.run_command."""

    def __init__(self, grace_s: float = 5.0) -> None:
        self.grace_s = grace_s

    def run(
        self,
        argv: list[str],
        *,
        cwd: Path,
        log_path: Path,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        on_start: Callable[[int, int], None] | None = None,
        on_line: Callable[[str], None] | None = None,
        stop_event: threading.Event | None = None,
    ) -> RunResult:
        return run_command(
            argv,
            cwd=cwd,
            log_path=log_path,
            timeout_s=timeout_s,
            env=env,
            grace_s=self.grace_s,
            on_start=on_start,
            on_line=on_line,
            stop_event=stop_event,
        )


def make_proposer(spec: str, seed: int, **kwargs: Any) -> Proposer | None:
    """`knobs`, `queue` (external proposals only → None) or `llm:<profile>`."""
    if spec == "knobs":
        from agent.proposers.knobs import KnobsProposer

        return KnobsProposer(seed=seed)
    if spec == "queue":
        return None
    if spec.startswith("llm:"):
        from agent.proposers.llm import make_llm_proposer

        return make_llm_proposer(spec.split(":", 1)[1], seed=seed, **kwargs)
    raise ConfigError(f"proposer: unknown proposer {spec!r} (use knobs, queue or llm:<profile>)")
