"""Planted: prints progress lines as fast as it can, forever (or FLOOD_LINES lines, then a summary).

FLOOD_IGNORE_TERM=1 makes it ignore SIGTERM as well.
"""

import os
import signal
import sys

if os.environ.get("FLOOD_IGNORE_TERM") == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
limit = int(os.environ.get("FLOOD_LINES", "0"))
write = sys.stdout.write
step = 0
while not limit or step < limit:
    step += 1
    write(f"step {step} loss {1.0 + 1.0 / step:.6f}\n")
if limit:
    write("---\nval_bpb: 0.9979\n")
sys.stdout.flush()
