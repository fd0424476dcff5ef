"""Planted: starts a sleeping grandchild, writes its pid to SPAWN_PID_FILE, exits 0 at once."""

import os
import subprocess
import sys

grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
pid_file = os.environ["SPAWN_PID_FILE"]
with open(pid_file + ".tmp", "w") as handle:
    handle.write(str(grandchild.pid))
os.replace(pid_file + ".tmp", pid_file)
print("leaving the grandchild behind")
