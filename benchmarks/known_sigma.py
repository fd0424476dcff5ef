"""Why σ is measured, not stated: the keep rule with the night's σ̂ against the same rule told a
σ (as the removed `noise_sigma` setting did: that σ, on the normal), on the stationary night and
three held-out worlds, through the real decide().

    .venv/bin/python benchmarks/known_sigma.py --sweeps 200

A stated σ is exact in no world: the noise moves with the load, the change and the night. The
rows at 0.8 and 0.6 of the true σ show what a user who states it a little small gets: the FDR
the rule holds by construction (≤ `fdr`, 20 %) is no longer held.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from keep_rule import heldout, row  # noqa: E402
from keep_world import World, simulate  # noqa: E402

from agent.rules import decide  # noqa: E402
from agent.rules.decide import Rule  # noqa: E402


def stated(sigma: float):  # type: ignore[no-untyped-def]
    """decide's pooled σ̂ replaced by `sigma` on the normal (0 degrees of freedom)."""
    def pooled_of(parts: Iterable[tuple[float, int]], prior: tuple[float, int] = (0.0, 0)
                  ) -> tuple[float | None, int]:
        return sigma, 0
    return mock.patch.object(decide, "pooled_of", pooled_of)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--stated", default="1.0,0.8,0.6",
                    help="stated σ, in units of the world's noise scale σ")
    args = ap.parse_args()
    names = ("heavy tails", "rare small gains", "slow drift")
    worlds = [World("stationary σ=1", sigma=1.0, source=None),
              *(w for w in heldout() if w.name.startswith(names))]
    print(f"{args.sweeps} sweeps a row; null keeps / FDR (mean over nights) / ≥3σ kept / runs a "
          "proposal (the targets: FDR ≤ 20 %, null keeps ≤ 3 %)")
    for label in ["measured", *args.stated.split(",")]:
        cells = []
        for world in worlds:
            if label == "measured":
                t = simulate(Rule(), world, args.sweeps, args.seed)
            else:
                with stated(float(label) * world.sigma):
                    t = simulate(Rule(), world, args.sweeps, args.seed)
            r = row(t)
            kept = "–" if r["big_kept"] != r["big_kept"] else f"{r['big_kept']:.1%}"
            cells.append(f"{world.name}: {r['null_keep']:.1%} / {r['fdr']:.1%} / {kept} / "
                         f"{r['runs']:.2f}")
        name = "σ̂ measured" if label == "measured" else f"σ stated {label}×"
        print(f"{name:16s} " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
