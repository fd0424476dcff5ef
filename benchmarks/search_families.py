"""Synthetic targets with known truth for benchmarks/search.py.

A "train.py" of ten constants, and four families of metric (val_bpb-like, lower is better)
that are known functions of them. The optimum of each is 0.900 (every term is zero there and
the point is feasible), so the true regret of a configuration is f(config) - 0.900.

- bowl: one dominant knob (LR, two octaves off), five small ones, four that do nothing.
- interact: the best LR depends on WIDTH (lr* ∝ 1/WIDTH), the best DEPTH on WIDTH, the best
  WARMUP_FRAC on BATCH_SIZE: moving one knob moves another's optimum.
- crash: OOM when WIDTH × DEPTH × BATCH_SIZE exceeds a memory budget, NaN when LR > 0.016;
  the optimum (WIDTH 512, DEPTH 6, LR 0.01) sits close to both edges.
- coupled: eight knobs that matter (two do nothing), the interactions of `interact` and two crash
  regions that move with the other knobs: NaN when LR > 1.6 × the best LR for the current WIDTH
  (so widening a model whose LR was tuned for a narrow one diverges), OOM when WIDTH × DEPTH ×
  BATCH_SIZE exceeds a memory budget only 25 % above the optimum's (WIDTH 512, DEPTH 8,
  BATCH_SIZE 64, LR 6e-3).

Measurement noise: a Gaussian of σ = NOISE_SIGMA = 0.002 on every run, the seed-to-seed noise
of a 5-minute run quoted in ../shared/loop-protocol.md (~0.002 bpb); the small knobs' effects
are 1–3 σ, the baseline's regret 75–115 σ.
"""

from __future__ import annotations

import math

TRAIN_PY = '''"""Synthetic trainer (benchmarks/search.py): the metric is a known function."""

LR = 3e-3  # peak learning rate
WIDTH = 192  # model width
DEPTH = 3  # blocks
BATCH_SIZE = 24  # sequences per step
WARMUP_FRAC = 0.05  # warm-up fraction of the budget
WEIGHT_DECAY = 0.1  # AdamW weight decay
ADAM_BETA2 = 0.95  # AdamW beta2
ROPE_BASE = 10000.0  # RoPE base
USE_SWIGLU = False  # SwiGLU MLP
SOFTCAP = 15.0  # logit soft-cap


def train():
    return LR, WIDTH, DEPTH, BATCH_SIZE, WARMUP_FRAC, WEIGHT_DECAY
'''
OPTIMUM = 0.900
NOISE_SIGMA = 0.002
MEMORY_LIMIT = 6.5  # in units of WIDTH 128, DEPTH 4, BATCH 32 (the baseline uses 0.84)


def _oct(x: float, best: float) -> float:
    """Distance in octaves, squared."""
    return math.log2(x / best) ** 2


def _logit(p: float) -> float:
    p = min(max(p, 1e-9), 1 - 1e-9)
    return math.log(p / (1 - p))


def _odds(x: float, best: float) -> float:
    return (_logit(x) - _logit(best)) ** 2


def bowl(c: dict[str, float]) -> float | str:
    return (OPTIMUM + 0.03 * _oct(c["LR"], 1.2e-2) + 0.01 * _oct(c["WIDTH"], 256)
            + 0.01 * _oct(c["DEPTH"], 6) + 0.004 * _odds(c["WARMUP_FRAC"], 0.02)
            + 0.006 * _odds(c["ADAM_BETA2"], 0.98) + (0.0 if c["USE_SWIGLU"] else 0.006)
            + 0.002 * _oct(c["BATCH_SIZE"], 32))


def interact(c: dict[str, float]) -> float | str:
    width = c["WIDTH"]
    lr_best = 0.024 * 128 / width
    depth_best = 4 * math.sqrt(width / 128)
    warmup_best = min(0.1 * 32 / c["BATCH_SIZE"], 0.5)
    return (OPTIMUM + 0.015 * _oct(c["LR"], lr_best) + 0.02 * _oct(width, 512)
            + 0.01 * _oct(c["DEPTH"], depth_best) + 0.008 * _oct(c["BATCH_SIZE"], 64)
            + 0.004 * _odds(c["WARMUP_FRAC"], warmup_best)
            + 0.004 * _odds(c["ADAM_BETA2"], 0.98))


def memory(c: dict[str, float]) -> float:
    return c["WIDTH"] / 128 * c["DEPTH"] / 4 * c["BATCH_SIZE"] / 32


def crash(c: dict[str, float]) -> float | str:
    if memory(c) > MEMORY_LIMIT:
        return "oom"
    if c["LR"] > 0.016:
        return "nan"
    return (OPTIMUM + 0.03 * _oct(c["LR"], 1e-2) + 0.02 * _oct(c["WIDTH"], 512)
            + 0.01 * _oct(c["DEPTH"], 6) + 0.004 * _odds(c["ADAM_BETA2"], 0.98)
            + (0.0 if c["USE_SWIGLU"] else 0.006) + 0.004 * _oct(c["BATCH_SIZE"], 32))


COUPLED_MEMORY_LIMIT = 16 * MEMORY_LIMIT / 6  # the optimum uses 16: as near the edge as `crash`'s
NAN_AT = 1.6  # × the best LR for the width


def coupled(c: dict[str, float]) -> float | str:
    width = c["WIDTH"]
    lr_best = 0.024 * 128 / width
    if memory(c) > COUPLED_MEMORY_LIMIT:
        return "oom"
    if c["LR"] > NAN_AT * lr_best:
        return "nan"
    depth_best = 4 * math.sqrt(width / 128)
    warmup_best = min(0.1 * 32 / c["BATCH_SIZE"], 0.5)
    return (OPTIMUM + 0.015 * _oct(c["LR"], lr_best) + 0.02 * _oct(width, 512)
            + 0.01 * _oct(c["DEPTH"], depth_best) + 0.008 * _oct(c["BATCH_SIZE"], 64)
            + 0.004 * _odds(c["WARMUP_FRAC"], warmup_best)
            + 0.004 * _odds(c["WEIGHT_DECAY"], 0.05) + 0.004 * _odds(c["ADAM_BETA2"], 0.98)
            + (0.0 if c["USE_SWIGLU"] else 0.006))


FAMILIES = {"bowl": bowl, "interact": interact, "crash": crash, "coupled": coupled}
CRASH_LOG = {
    "oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "nan": "step 40 | loss nan\nFAIL",
}
