"""Planted: runs out of memory (simulated) after one progress line."""

print("step 1 | loss 4.20 | elapsed 0.1s")
raise MemoryError("simulated allocation failure")
