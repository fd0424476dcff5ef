"""Planted: ignores SIGTERM and starts a grandchild (same process group) that ignores it too.

The grandchild's pid is written to the file named by STUBBORN_PID_FILE.
"""

import os
import signal
import subprocess
import sys
import time

GRANDCHILD = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "while True:\n"
    "    time.sleep(60)\n"
)

signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen([sys.executable, "-c", GRANDCHILD])
pid_file = os.environ["STUBBORN_PID_FILE"]
with open(pid_file + ".tmp", "w") as handle:
    handle.write(str(grandchild.pid))
os.replace(pid_file + ".tmp", pid_file)
print(f"grandchild {grandchild.pid}", flush=True)
while True:
    time.sleep(60)
