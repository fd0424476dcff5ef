"""Checks on a real run of the gpt target that hold on a machine of any speed.

The target's head is zero-initialised, so its first loss is exactly ln(256) nats (8 bits per
byte), and its LR schedule is time-based: on a loaded machine a short budget can end inside the
warm-up (only the first, untimed steps and one timed step, all at LR 0), and then nothing was
learned. So the check is made against the run's own start: with no update at a nonzero LR the
metric is the uniform 8 bits; with one, it is below that.
"""

from __future__ import annotations

import math
import re

PROGRESS = re.compile(r"^step (\d+) \| loss (\d+\.\d+) \| lr (\S+) \|", re.M)


def check_learning(log: str, val_bpb: float) -> None:
    """Assert val_bpb against the initial loss measured in the same run (see the module doc)."""
    steps = PROGRESS.findall(log)
    assert steps and steps[0][0] == "1", log[-2000:]
    start_bpb = float(steps[0][1]) / math.log(2)
    assert abs(start_bpb - 8.0) < 1e-3, f"a zero-initialised head starts at 8 bits: {steps[0]}"
    assert math.isfinite(val_bpb) and val_bpb > 0, val_bpb
    # The last progress line is the last step; its LR is 0 only if every step's was.
    if float(steps[-1][2]) == 0.0:
        assert abs(val_bpb - start_bpb) < 1e-3, (val_bpb, steps)  # untouched weights
    else:
        assert val_bpb < start_bpb - 1e-4, (val_bpb, steps)  # an update made it better
