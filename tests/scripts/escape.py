"""Planted: double-forks a grandchild that calls setsid() and chdir("/"), then sleeps forever.

The grandchild writes its pid to ESCAPE_PID_FILE. ESCAPE_PARENT=exit makes the trainer exit 0
at once (leaving the escaped grandchild behind); otherwise it sleeps too.
"""

import os
import signal
import time

pid_file = os.environ["ESCAPE_PID_FILE"]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.chdir("/")
        with open(pid_file + ".tmp", "w") as handle:
            handle.write(str(os.getpid()))
        os.replace(pid_file + ".tmp", pid_file)
        while True:
            time.sleep(60)
    os._exit(0)
os.wait()
print("grandchild escaped", flush=True)
while os.environ.get("ESCAPE_PARENT") != "exit":
    time.sleep(60)
