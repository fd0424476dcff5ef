"""Why the night's level keeps ADDIS's τ = 0.5 and λ = 0.25 (Tian and Ramdas's choice): the
default rule against the same rule with no test set aside (τ = 1, SAFFRON) and with λ = 0.5, on
keep_rule.py's stationary and shifting worlds and three of its held-out ones.

    .venv/bin/python benchmarks/addis_params.py --sweeps 300

An ablation: it rebinds agent.rules.fdr.TAU and LAMBDA, which agent.rules.fdr.level reads at
each call; nothing in the product reads this file.
"""

from __future__ import annotations

import argparse
import math

from keep_rule import heldout, row
from keep_world import World, simulate

import agent.rules.fdr as fdr
from agent.rules.decide import Rule

VARIANTS = {"τ 0.5, λ 0.25 (default)": (0.5, 0.25), "τ 1 (nothing set aside)": (1.0, 0.25),
            "λ 0.5": (0.5, 0.5)}


def worlds() -> list[World]:
    kept = ("heavy tails (t3)", "rare small gains", "rare gains, t3, shifting")
    return [World("stationary σ=1", source=None),
            World("shifting, progress lines", shifting=True, source="progress"),
            *(w for w in heldout() if w.name in kept)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print(f"{args.sweeps} nights × 100 proposals a world and variant")
    print(f"{'world':<28}{'ADDIS':<26}{'null keeps':>11}{'FDR':>7}{'≥3σ kept':>10}"
          f"{'runs/prop':>10}{'true gain':>10}")
    original = fdr.TAU, fdr.LAMBDA
    try:
        for world in worlds():
            for name, (tau, lam) in VARIANTS.items():
                fdr.TAU, fdr.LAMBDA = tau, lam
                r = row(simulate(Rule(), world, args.sweeps, args.seed))
                kept = "–" if math.isnan(r["big_kept"]) else f"{r['big_kept']:.1%}"
                print(f"{world.name:<28}{name:<26}{r['null_keep']:>11.1%}{r['fdr']:>7.1%}"
                      f"{kept:>10}{r['runs']:>10.2f}{r['gain']:>10.2f}", flush=True)
    finally:
        fdr.TAU, fdr.LAMBDA = original
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
