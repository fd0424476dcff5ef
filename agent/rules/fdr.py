"""The night's false-discovery rate, held by construction: each test's level from the tests
before it, by ADDIS (Tian and Ramdas, 2019). Pure: the stdlib only.

A night is a stream of tests, one per change decided on its runs, each ending with a p-value and
keep or not. ADDIS sets test t's level α_t from those before it so that the expected share of
keeps that are not real gains (FDR) stays at most `fdr` for independent tests, whatever the mix
of changes: a test with p above τ costs nothing, a near-miss (p ≤ τλ) does not age the level,
each keep earns the next tests more. The paper's parameters (benchmarks/addis_params.py):
τ = 0.5, λ = 0.25, initial wealth τλα (its largest); γ_j = 1/(j(j + 1)), which sums to 1 with no
constant to choose (the paper's 0.4375 / j^1.6 does no better: on the 12 worlds of
benchmarks/keep_rule.py the clear gains kept differ by −1.6 to +2.2 points, FDR within 20 %).
"""

from __future__ import annotations

from collections.abc import Sequence

TAU, LAMBDA = 0.5, 0.25  # discard above τ; a candidate at most τλ (Tian and Ramdas's choice)


def _gamma(j: int) -> float:
    return 1.0 / ((j + 1) * (j + 2))  # γ_{j+1} = 1/((j + 1)(j + 2)): j counts from 0, Σγ = 1


def level(tests: Sequence[tuple[float, bool]], fdr: float) -> float:
    """α_t for the next test, given the night's earlier tests as (p-value, kept) in the order
    they were decided."""
    w0 = TAU * LAMBDA * fdr
    per_keep = TAU * (1 - LAMBDA) * fdr
    selected = candidates = 0
    keeps: list[list[int]] = []  # per keep: [tests selected up to it, candidates after it]
    for p, kept in tests:
        if p > TAU:
            continue  # discarded: as if it never ran
        selected += 1
        candidate = p <= TAU * LAMBDA
        candidates += candidate
        for k in keeps:
            k[1] += candidate
        if kept:
            keeps.append([selected, 0])
    alpha = w0 * _gamma(selected - candidates)
    for i, (at, after) in enumerate(keeps):
        alpha += (per_keep - w0 if i == 0 else per_keep) * _gamma(selected - at - after)
    return min(TAU * LAMBDA, alpha)
