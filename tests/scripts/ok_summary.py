"""Planted: a healthy run that prints progress lines and a final summary block."""

import time

start = time.monotonic()
for step, loss in ((1, 4.5), (2, 3.9), (3, 3.41)):
    print(f"step {step} | loss {loss:.2f} | elapsed {time.monotonic() - start:.1f}s")
    time.sleep(0.05)
print("---")
print("val_bpb:          0.997900")
print("training_seconds: 300.1")
print("total_seconds:    325.9")
print("peak_memory_mb:   45060.2")
print("mfu_percent:      nan")
print("total_tokens_M:   499.6")
print("num_steps:        953")
print("num_params_M:     50.3")
