"""Fake trainer whose metric is pure noise: 1.0 + N(0, SIGMA), seeded by OVERNIGHT_SEED.

Its knob IDEA changes nothing but the random stream (as any code change does), so every
proposal is a null change. Same output contract as a real trainer.
"""

import os
import random
import time

IDEA = 0  # proposals change this; the metric's distribution does not depend on it
SIGMA = 0.05
STEPS = 40

seed = int(os.environ.get("OVERNIGHT_SEED", "42"))
budget = float(os.environ.get("OVERNIGHT_BUDGET_S", "0.2"))
rng = random.Random(seed * 1_000_003 + IDEA)
start = time.time()
for step in range(1, STEPS + 1):
    if step % 10 == 0:
        print(f"step {step} | loss {5.0 / step:.4f} | elapsed {time.time() - start:.2f}s")
    time.sleep(budget / STEPS)
trained = time.time() - start
print("---")
print(f"val_bpb:          {1.0 + rng.gauss(0.0, SIGMA):.6f}")
print(f"training_seconds: {trained:.3f}")
print(f"total_seconds:    {time.time() - start:.3f}")
print("peak_memory_mb:   100.0")
print(f"num_steps:        {STEPS}")
