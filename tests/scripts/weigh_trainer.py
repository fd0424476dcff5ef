"""Fake trainer with a component that does nothing and a width that costs memory: the metric is
seed noise around a level that only LAYERS moves; peak_memory_mb grows with LAYERS. Same
output contract as a real trainer: the summary block after `---`."""

import os
import random

LAYERS = 4  # more layers: a lower loss, and more memory
NOISE = 0.01  # seed-to-seed spread of the metric


def smooth(loss):
    """A component that changes nothing: the loss passes through it unchanged."""
    out = loss
    for _ in range(3):
        out = out * 1.0
    return out


seed = int(os.environ.get("OVERNIGHT_SEED", "42"))
rng = random.Random(seed)
loss = 3.0 - 0.02 * LAYERS + rng.gauss(0.0, NOISE)
loss = smooth(loss)
print("---")
print(f"val_loss:         {loss:.6f}")
print(f"peak_memory_mb:   {640.0 * LAYERS * (1 + rng.gauss(0.0, 0.001)):.1f}")
print("training_seconds: 0.01")
