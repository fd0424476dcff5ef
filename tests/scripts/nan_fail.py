"""Planted: the loss goes NaN; the script prints FAIL and exits 1."""

import sys

print("step 1 | loss 4.20 | elapsed 0.1s")
print("step 2 | loss nan | elapsed 0.2s")
print("FAIL")
sys.exit(1)
