"""What a commit's repeated runs say about the noise and the load, with the line to add when
they cannot say it: a script that ignores OVERNIGHT_SEED, a script whose speed is unknown.

Pure: the stdlib and agent.rules.blocking / throughput only. Used at the baseline (the
loop's warnings, the CLI's hints) and by `overnight doctor`.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.rules.conditions import Sample
from agent.rules.contract import Check
from agent.rules.throughput import NONE_FIX, NONE_HINT

STEADY = 0.2  # doctor: two runs of the same code this far apart in speed measured the load
SEED_FIX = (
    "seed every generator from the service's seed, e.g. "
    "`seed = int(os.environ.get('OVERNIGHT_SEED', 1337))` then `torch.manual_seed(seed)` "
    "(and `random.seed(seed)`, `numpy.random.seed(seed)`)"
)


def identical_repeats(runs: Sequence[Sample]) -> tuple[int, float] | None:
    """(how many, the value) when two runs or more with different seeds printed the same
    metric to the digit; None when the seed changed the metric (or there are not two)."""
    by_value: dict[float, set[int | None]] = {}
    for r in runs:
        by_value.setdefault(r.metric, set()).add(r.seed)
    if len(runs) < 2 or len(by_value) > 1:
        return None
    ((value, seeds),) = by_value.items()
    return (len(runs), value) if len(seeds) > 1 else None


def seed_ignored(runs: Sequence[Sample], metric: str) -> str | None:
    """The warning for identical repeats, with the fix (None when there are none)."""
    same = identical_repeats(runs)
    if same is None:
        return None
    seeds = sorted({r.seed for r in runs if r.seed is not None})
    return (f"the {same[0]} runs with seeds {', '.join(map(str, seeds))} printed the same "
            f"{metric} {same[1]:.6g}: the script ignores OVERNIGHT_SEED, so its repeats say "
            f"nothing about the noise (σ̂ leaves them out; a `noise_sigma` in overnight.toml "
            f"stands in). Fix: {SEED_FIX}")


def load_unchecked(runs: Sequence[Sample]) -> str | None:
    """The warning when no run knows its speed (None when one does)."""
    if not runs or any(r.throughput is not None for r in runs):
        return None
    return f"{NONE_HINT}. Fix: {NONE_FIX}"


def baseline_warnings(runs: Sequence[Sample], metric: str) -> tuple[str, ...]:
    return tuple(w for w in (seed_ignored(runs, metric), load_unchecked(runs)) if w)


def check_seed(runs: Sequence[Sample], metric: str) -> Check:
    """`overnight doctor`: does the metric move with OVERNIGHT_SEED?"""
    warning = seed_ignored(runs, metric)
    if warning:
        head, _, fix = warning.partition(" Fix: ")
        return Check("seed used", "warn", head, fix)
    values = ", ".join(f"{r.metric:g} (seed {r.seed})" for r in runs)
    return Check("seed used", "ok", f"{metric} {values}")


def check_speed(runs: Sequence[Sample], tolerance: float = STEADY) -> Check:
    """`overnight doctor`: where the throughput comes from (so that a sweep can tell the
    machine's load from a change), and whether the machine held still across the runs."""
    if load_unchecked(runs):
        return Check("load check", "warn", NONE_HINT, NONE_FIX)
    known = [r for r in runs if r.throughput is not None]
    source = known[0].source or "?"
    speeds = [r.throughput for r in known if r.throughput is not None]
    text = " then ".join(f"{s:.4g}/s" for s in speeds)
    if len(speeds) > 1 and max(speeds) > min(speeds) * (1 + tolerance):
        return Check("load check", "warn", f"throughput from {source}: {text} for the same "
                     "code: the machine's load moved (and with it the metric)",
                     "measure the noise on an otherwise idle machine before setting min_delta")
    return Check("load check", "ok", f"throughput from {source}: {text}")
