"""Which accelerator each slot runs on: detect the GPUs, parse --devices, pin a slot's runs.

No torch: the service finds GPUs through CUDA_VISIBLE_DEVICES, `nvidia-smi` or the driver's /proc.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from agent.core.errors import ConfigError


def slot_env(slot: int, devices: Sequence[str]) -> dict[str, str]:
    """Slot i runs on devices[i] (modulo their number); nothing is pinned without devices."""
    return {"CUDA_VISIBLE_DEVICES": devices[slot % len(devices)]} if devices else {}


def parse_devices(spec: str) -> tuple[str, ...]:
    """'0,1,4' → ('0', '1', '4'). Raises ConfigError on anything but distinct GPU indexes."""
    items = [p.strip() for p in spec.split(",") if p.strip()]
    if not items or not all(p.isdigit() for p in items) or len(set(items)) != len(items):
        raise ConfigError(f"--devices: expected distinct GPU indexes such as '0,1,4', got {spec!r}")
    return tuple(items)


def detect_devices(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The GPUs this process may use, without importing torch: CUDA_VISIBLE_DEVICES if set,
    else `nvidia-smi`'s list, else the driver's /proc entries; () on a machine without one."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return tuple(p.strip() for p in visible.split(",") if p.strip() and p.strip() != "-1")
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10, check=True).stdout
            return tuple(line.strip() for line in out.splitlines() if line.strip().isdigit())
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        return tuple(str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus"))))
    except OSError:
        return ()
