"""Fake trainer on a machine whose speed a test sets: the work done in the budget is the steps
the machine's current speed allows (read from MACHINE, a file the test rewrites between runs),
and the metric is that work plus seed noise (higher is better).

Its knob IDEA changes nothing (every proposal is a null change) unless the test names it in
GAINS (the share of work it adds): on a time budget a faster stretch of the machine trains more
steps and looks better, which is all a null change's runs then measure. On a compute budget
(OVERNIGHT_BUDGET_STEPS) it trains exactly those steps, the machine's speed setting only how
long they take. Same output contract as a real trainer: progress lines with elapsed seconds,
then the summary block with num_steps.
"""

import os
import random
import time

IDEA = 0  # proposals change this; the work done does not depend on it (but for GAINS)
MACHINE = "machine.txt"  # the test writes its own path here: the machine's speed factor
# the test writes real effects here: IDEA -> share of work added
GAINS: dict[int, float] = {}
STEPS = 1000  # steps per budget at speed 1
NOISE = 0.01  # seed-to-seed spread of the metric, as a share of the work
# the test sets this to print secondary keys too: peak_vram_mb and tokens_per_s (each run's
# own, by its seed and speed) and mfu_percent on odd seeds only (a key some runs do not print)
SECONDARY = False

seed = int(os.environ.get("OVERNIGHT_SEED", "42"))
budget = float(os.environ.get("OVERNIGHT_BUDGET_S", "0.05"))
with open(MACHINE) as fh:
    speed = float(fh.read())
rng = random.Random(seed * 1_000_003 + IDEA)
start = time.time()
effect = 1 + GAINS.get(IDEA, 0.0)
fixed = os.environ.get("OVERNIGHT_BUDGET_STEPS")
if fixed:  # a compute budget: its steps, in as long as the machine's speed takes
    steps = int(fixed)
    budget = 0.25 * steps / (STEPS * speed)
    work = steps * effect
else:
    steps = int(STEPS * speed * effect * (1 + rng.gauss(0.0, 0.002)))
    work = steps
for k in (1, 2, 3, 4):
    print(f"step {steps * k // 4} | loss {1000.0 / work:.4f} | elapsed {budget * k / 4:.3f}s")
time.sleep(budget)
print("---")
print(f"work:             {work * (1 + rng.gauss(0.0, NOISE)):.2f}")
print(f"training_seconds: {budget:.3f}")
print(f"total_seconds:    {time.time() - start:.3f}")
print(f"num_steps:        {steps}")
if SECONDARY:
    print(f"peak_vram_mb:     {1000.0 + 7.0 * (seed - 42) + 100.0 * speed:.1f}")
    print(f"tokens_per_s:     {steps / max(budget, 1e-9):.1f}")
    if seed % 2:
        print(f"mfu_percent:      {30.0 + seed / 10:.2f}")
