"""A finished training whose evaluation crashed: the run's checkpoint folder and the re-run.

Each run gets an empty folder, $OVERNIGHT_CHECKPOINT_DIR, inside its worktree (a sandboxed run
can write there; the worktree goes when the experiment ends). A script that saves its trained
model there before it evaluates has finished training once the folder holds a file: a crash
after that is an evaluation crash (agent.rules.classify), not a lost idea. When the target has
an `eval_command`, that command runs once in the same worktree with OVERNIGHT_EVAL_RETRY=1 (a
hint to evaluate in smaller batches); its summary block completes the run's, and the crash it
recovered from stays in the run's summary as `evaluation_rerun`.

Pure file checks and RunResult arithmetic; the re-run itself is started by
agent.engine.attempt. Not guaranteed: salvage on a Ray node that does not share the
coordinator's disk (the folder is looked at on the coordinator's side).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from agent.core.config import TargetConfig
from runner.result import Outcome, RunResult

CHECKPOINT_DIR = Path(".overnight") / "checkpoint"
CHECKPOINT_ENV = "OVERNIGHT_CHECKPOINT_DIR"
RETRY_ENV = "OVERNIGHT_EVAL_RETRY"
RERUN_KEY = "evaluation_rerun"  # the summary key that says which crash the re-run replaced
EVAL_LOG_SUFFIX = ".eval.log"


def fresh_checkpoint_dir(wt: Path) -> Path:
    """The run's checkpoint folder, emptied (an earlier run in this worktree may have left
    one), as an absolute path."""
    folder = wt / CHECKPOINT_DIR
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder.resolve()


def training_finished(wt: Path) -> bool:
    """Did the last run in this worktree save its checkpoint (a file in the folder)?"""
    folder = wt / CHECKPOINT_DIR
    return folder.is_dir() and any(p.is_file() for p in folder.rglob("*"))


def salvageable(result: RunResult, config: TargetConfig, wt: Path) -> bool:
    """A run that ended by itself (or was killed by a signal we did not send) without a
    usable metric, after saving its checkpoint, for a target that can evaluate again."""
    if config.eval_command is None or result.fail_marker:
        return False
    if result.outcome not in (Outcome.EXITED, Outcome.SIGNALED):
        return False  # a timeout, a cancel, a start that failed: nothing to salvage
    if result.ok and isinstance(result.summary.get(config.metric), int | float):
        return False
    return training_finished(wt)


def merged(first: RunResult, rerun: RunResult, metric: str) -> RunResult:
    """The run as recorded: the training's summary completed by the evaluation's when the
    re-run printed the metric; else the first crash, its error saying the re-run failed too."""
    crash = first.error or (f"signal {first.signal}" if first.signal else
                            f"exit code {first.exit_code} without {metric}")
    if rerun.ok and isinstance(rerun.summary.get(metric), int | float):
        return replace(
            rerun,
            wall_s=first.wall_s + rerun.wall_s,
            summary={**first.summary, **rerun.summary, RERUN_KEY: crash},
            log_path=first.log_path,
            log_tail=f"{first.log_tail}\n--- evaluation re-run ---\n{rerun.log_tail}",
            pgid=first.pgid,
        )
    failed = rerun.error or (rerun.outcome.value if rerun.outcome is not Outcome.EXITED
                             else f"exit code {rerun.exit_code} without {metric}")
    return replace(first, wall_s=first.wall_s + rerun.wall_s,
                   error=f"{crash} (the evaluation re-run failed too: {failed})")
