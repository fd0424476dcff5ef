"""A claiming worker for the concurrent-claim tests: waits for the go file, then claims until
nothing is left, printing each experiment id it won.

usage: claimer.py DB GO_FILE next|ids [ID ...]
  next: claim_next() until None; ids: claim(id) for each id in the given order.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from db.engine import make_engine
from db.store import SqlStore


def main() -> None:
    db, go, mode, *ids = sys.argv[1:]
    store = SqlStore(make_engine(db))
    store.ping()  # connected before the start line, so all start together
    print("ready", flush=True)
    while not Path(go).exists():  # the barrier: every worker starts on the same signal
        time.sleep(0.005)
    if mode == "next":
        while (exp := store.claim_next()) is not None:
            print(exp.id, flush=True)
    else:
        for exp_id in ids:
            if store.claim(int(exp_id)) is not None:
                print(exp_id, flush=True)
    store.engine.dispose()


if __name__ == "__main__":
    main()
