"""Why the night's level keeps ADDIS's τ = 0.5 and λ = 0.25 (Tian and Ramdas's choice): the
default rule against the same rule with no test set aside (τ = 1, SAFFRON) and with λ = 0.5, on
keep_rule.py's stationary and shifting worlds and three of its held-out ones.

    .venv/bin/python benchmarks/addis_params.py --sweeps 300

An ablation: it rebinds agent.rules.fdr.TAU and LAMBDA, which agent.rules.fdr.level reads at
each call; nothing in the product reads this file.
"""

from __future__ import annotations

import argparse

from keep_rule import ablation, heldout
from keep_world import World

import agent.rules.fdr as fdr

VARIANTS = {"τ 0.5, λ 0.25 (default)": (0.5, 0.25), "τ 1 (nothing set aside)": (1.0, 0.25),
            "λ 0.5": (0.5, 0.5)}


def worlds() -> list[World]:
    kept = ("heavy tails (t3)", "rare small gains", "rare gains, t3, shifting")
    return [World("stationary σ=1", source=None),
            World("shifting, progress lines", shifting=True, source="progress"),
            *(w for w in heldout() if w.name in kept)]


def use(params: tuple[float, float]) -> None:
    fdr.TAU, fdr.LAMBDA = params


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    original = fdr.TAU, fdr.LAMBDA
    try:
        ablation(worlds(), VARIANTS, use, args.sweeps, args.seed, "ADDIS")
    finally:
        use(original)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
