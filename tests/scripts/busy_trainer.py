"""Fake trainer whose metric is the work it completes: CPU-bound steps for OVERNIGHT_BUDGET_S.

Each step is a fixed amount of pure-Python arithmetic, so `work` (steps done in the budget;
higher is better) measures the machine's speed and nothing else: on a loaded machine it is
lower, as a real time-budgeted training reaches a worse loss. Its knob IDEA changes nothing
(every proposal is a null change). REPORT_STEPS chooses where the throughput shows: True,
`num_steps` in the summary block; False, only the progress lines (with elapsed seconds).
Same output contract as a real trainer.
"""

import os
import time

IDEA = 0  # proposals change this; the work done does not depend on it
REPORT_STEPS = True
STEP_OPS = 20_000

seed = int(os.environ.get("OVERNIGHT_SEED", "42"))
budget = float(os.environ.get("OVERNIGHT_BUDGET_S", "1.0"))
start = time.perf_counter()
step, acc, last_print = 0, seed, start
while time.perf_counter() - start < budget:
    for i in range(STEP_OPS):
        acc = (acc * 1_103_515_245 + i) % 2_147_483_648
    step += 1
    now = time.perf_counter()
    if now - last_print >= 0.05:
        print(f"step {step} | loss {1000.0 / step:.4f} | elapsed {now - start:.3f}s", flush=True)
        last_print = now
trained = time.perf_counter() - start
print("---")
print(f"work:             {step}")
print(f"training_seconds: {trained:.3f}")
print(f"total_seconds:    {time.perf_counter() - start:.3f}")
if REPORT_STEPS:
    print(f"num_steps:        {step}")
