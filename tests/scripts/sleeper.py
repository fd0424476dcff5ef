"""Planted: never ends by itself."""

import time

print("sleeping", flush=True)
while True:
    time.sleep(60)
