"""The local executor: the Runner port on runner.process.run_command (a subprocess here)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from runner.process import run_command
from runner.result import RunResult


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
        pass_env: Sequence[str] = (),
        on_start: Callable[[int, int], None] | None = None,
        on_line: Callable[[str], None] | None = None,
        stop_event: threading.Event | None = None,
        on_submit: Callable[[str], None] | None = None,
    ) -> RunResult:
        del on_submit  # no batch scheduler here
        return run_command(
            argv,
            cwd=cwd,
            log_path=log_path,
            timeout_s=timeout_s,
            env=env,
            pass_env=pass_env,
            grace_s=self.grace_s,
            on_start=on_start,
            on_line=on_line,
            stop_event=stop_event,
        )
