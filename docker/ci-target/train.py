"""The image check's target (docker/ci.sh): a linear fit with CPU torch, a few seconds long."""

import os
import time

import torch

LR = 0.01
STEPS = 300

torch.manual_seed(int(os.environ.get("OVERNIGHT_SEED", "42")))
budget = float(os.environ.get("OVERNIGHT_BUDGET_S", "5"))
x = torch.linspace(-1, 1, 256).unsqueeze(1)
y = 3 * x + 1
model = torch.nn.Linear(1, 1)
opt = torch.optim.SGD(model.parameters(), lr=LR)
start = time.time()
for step in range(1, STEPS + 1):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 50 == 0:
        print(f"step {step} | loss {loss.item():.6f} | elapsed {time.time() - start:.2f}s",
              flush=True)
    if time.time() - start > budget:
        break
with torch.no_grad():
    val = torch.nn.functional.mse_loss(model(x), y).item()
print("---")
print(f"val_loss:         {val:.6f}")
print(f"training_seconds: {time.time() - start:.1f}")
print(f"num_steps:        {step}")
