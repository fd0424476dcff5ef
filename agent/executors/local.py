"""The local executor: the Runner port on runner.process.run_command (a subprocess here).

A run that asks for a CUDA device (OVERNIGHT_DEVICE `cuda`, `cuda:1`) on a machine that shows
no GPU to it is not started (RunNotStartedError): the GPU is looked for without torch, in the
run's CUDA_VISIBLE_DEVICES (empty or -1 hides them all) and the drivers' files (NVIDIA, AMD
ROCm, WSL).
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from agent.core.errors import RunNotStartedError
from runner.environment import guest_environment
from runner.process import run_command
from runner.result import RunResult

DEVICE_ENV = "OVERNIGHT_DEVICE"  # the device a run is asked to train on (agent.engine.attempt)
# A GPU's files: NVIDIA's devices and driver entries (one per GPU), AMD ROCm's device (torch's
# "cuda" there), WSL's.
GPU_FILES = ("/dev/nvidia[0-9]*", "/proc/driver/nvidia/gpus/*", "/dev/kfd", "/dev/dxg")


def no_gpu_for(env: Mapping[str, str]) -> str | None:
    """Why a run with this environment cannot have the CUDA device it asks for (one sentence,
    with the fix), or None: it asks for none, or a GPU is there."""
    device = env.get(DEVICE_ENV, "")
    if not device.lower().startswith("cuda"):
        return None
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not [p for p in visible.split(",") if p.strip() not in ("", "-1")]:
        where = f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    elif any(glob.glob(pattern) for pattern in GPU_FILES):
        return None
    else:
        where = "this machine has no GPU (no NVIDIA or AMD device under /dev)"
    return (f"the run asks for device {device!r} and {where}: run it on the CPU (--device cpu), "
            "or on a machine with a GPU")


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
        """Run `argv` here. Raises RunNotStartedError, before anything starts, when it asks
        for a CUDA device that this machine does not show it (no_gpu_for)."""
        del on_submit  # no batch scheduler here
        why = no_gpu_for(guest_environment(os.environ, env, pass_env))
        if why is not None:
            raise RunNotStartedError(why)
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
