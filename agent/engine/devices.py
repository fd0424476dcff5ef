"""Which accelerator each slot runs on: detect the GPUs, parse --devices, pin a slot's runs.

No torch: the service finds GPUs through CUDA_VISIBLE_DEVICES, `nvidia-smi` or the driver's /proc.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from agent.core.errors import ConfigError

logger = logging.getLogger(__name__)


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


# A slot whose runs crash on device errors this many times in a row is taken out of service.
MAX_DEVICE_FAILURES = 3


class DeviceWatch:
    """Counts each slot's device failures in a row; `retired`: slot → why it was taken out."""

    def __init__(self, devices: Sequence[str]) -> None:
        self.devices = devices
        self.failures: dict[int, int] = {}
        self.retired: dict[int, str] = {}

    def record_run(self, slot: int, failed_on_device: bool, reason: str | None) -> None:
        """After each run of `slot`: a device failure counts, anything else resets the count;
        the MAX_DEVICE_FAILURES-th in a row takes the slot out."""
        if not failed_on_device:
            self.failures[slot] = 0
            return
        n = self.failures[slot] = self.failures.get(slot, 0) + 1
        if n >= MAX_DEVICE_FAILURES:
            device = (f"GPU {slot_env(slot, self.devices)['CUDA_VISIBLE_DEVICES']}"
                      if self.devices else "its device")
            why = (f"slot {slot} ({device}) taken out after {n} device failures in a row; "
                   f"last: {(reason or '').splitlines()[0][:200] if reason else ''}")
            self.retired[slot] = why
            logger.error("%s. The other slots go on; check the device and restart to use it "
                         "again.", why)
