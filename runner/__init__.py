"""Run one training command under a hard wall-clock budget and report what happened.

A leaf package: it imports only the standard library and knows nothing of the database, git,
agents or HTTP. See runner.process for the guarantees.
"""

from runner.process import kill_process_group, process_group_alive, resolve_command, run_command
from runner.result import TAIL_LINES, Outcome, RunResult, last_error_line
from runner.summary import ProgressPoint, has_fail_marker, parse_progress, parse_summary

__all__ = [
    "TAIL_LINES",
    "Outcome",
    "ProgressPoint",
    "RunResult",
    "has_fail_marker",
    "kill_process_group",
    "last_error_line",
    "parse_progress",
    "parse_summary",
    "process_group_alive",
    "resolve_command",
    "run_command",
]
