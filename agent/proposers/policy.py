"""The learning search over constants: which knob to move next, which way and how far. Pure.

Inputs are the constants at the sweep head and the sweep's trials (agent.analysis.trials);
the output is every candidate move, best first (the caller takes the first whose diff is new).

- Effects: each knob has a posterior over a local quadratic of the metric in its own scale
  (agent.proposers.effects), learned from every one-constant run that moved it, weighted
  down as the head moves on. Thompson sampling: one posterior draw per knob scores that knob's
  candidate values, so exploration fades as evidence grows; seeded, hence deterministic.
- Steps: ×2 / ÷2 in the knob's scale at first (log, log-odds, rounded integers), then half and
  quarter steps, and the model's own optimum once it has one; after a keep the same step again
  that way (momentum); doubled on a plateau; never more than MAX_STEP. With nothing left to
  try, finer and wider steps rather than an end to the sweep.
- Crashes: a fundamental crash (OOM, NaN, timeout) of a one-constant change bounds that knob:
  nothing at or beyond the crashing value again, at most half-way to it; a direction that
  crashed twice is dropped (agent.proposers.search_state).
- Plateau: after PLATEAU_AFTER runs without a keep, the knobs of the last few runs rest and
  steps double. After RETEST_AFTER, a near-miss from an older head is re-tested (half its step,
  since the same lines would be a duplicate); after COMBINE_AFTER, two near-misses on
  different knobs are combined into one change. A near-miss is a discard that measured more
  than one standard error better than its incumbent (search_state.promising): a run within
  its noise of zero saw nothing, and is no lead.
- Null knobs: a knob moved both ways from its present value (a switch: its one way), every
  such run within one standard error of zero, is set aside (search_state.null_knobs) until
  no other move is left: on the local quadratic its gain anywhere within a ×4 move is then
  at most about two standard errors. (Its runs are no near-misses either.)
- Never an evaluated configuration again, whatever diff reached it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from itertools import combinations

from agent.analysis.trials import PLATEAU_AFTER, Change, Trial, near_misses
from agent.proposers.effects import Effect, Switch, coordinate_of, fit, switched_on
from agent.proposers.search_state import (
    SearchState,
    beyond,
    config_key,
    promising,
    read_state,
    safe,
    single,
)
from agent.rules.categories import Category, category_of_knob
from agent.rules.knob_space import FIRST_STEP, MIN_STEP, KnobValue, coordinate, moved

RETEST_AFTER = 3
COMBINE_AFTER = 5
RESTING_KNOBS = 3  # on a plateau, the knobs of this many last runs rest
STEP_LADDER = (1.0, 0.5, 0.25)  # × the base step; the base doubles on a plateau
MAX_STEP = 2 * FIRST_STEP  # no single move goes further than ×4 (odds ×4)
RESTING_PENALTY = 100.0


@dataclass(frozen=True)
class Move:
    """One proposed change of one or two constants, with why it was chosen."""

    changes: tuple[Change, ...]
    kind: str  # explore | exploit | momentum | retest | combine
    score: float
    why: str
    category: Category = Category.HYPERPARAMETER
    extra: dict[str, object] = field(default_factory=dict)


# --- choosing --------------------------------------------------------------------------------
def _base_step(state: SearchState, knob: KnobValue, direction: int) -> float:
    """×2 at first; after a keep on this knob its step again that way, half of it back;
    twice that on a plateau; never more than MAX_STEP."""
    step = FIRST_STEP
    last = state.last_keep.get(knob.name)
    if last is not None and last.new == knob.raw and last.step:
        step = last.step if last.direction == direction else last.step / 2
    return min(step * (2 if state.stall >= PLATEAU_AFTER else 1), MAX_STEP)


def _bounded(state: SearchState, knob: KnobValue, direction: int, literal: str) -> str | None:
    """Keep a move well short of a region that crashed: at most half-way to it."""
    bound = state.bounds.get((knob.name, direction))
    u_new, u_now = coordinate(knob.name, literal), coordinate(knob.name, knob.raw)
    if bound is None or u_new is None or u_now is None:
        return literal
    half = (bound - u_now) / 2 * direction
    if (u_new - u_now) * direction > half:
        cut = moved(knob, direction, half) if half >= state.min_step else None
        literal = cut if cut is not None else ""
    return literal if literal and not beyond(state, knob.name, direction, literal) else None


def _knobs_to_rest(state: SearchState) -> set[str]:
    if state.stall < PLATEAU_AFTER:
        return set()
    return {c.name for t in state.items[-RESTING_KNOBS:] for c in t.changes}


def _steps(state: SearchState, knob: KnobValue, model: Effect) -> list[tuple[int, float]]:
    """(direction, step) to consider: where the model puts the optimum, then the ladder."""
    reach = MAX_STEP * state.reach
    ladder = STEP_LADDER + tuple(2.0 ** k for k in range(1, int(math.log2(state.reach)) + 2)
                                 if state.reach > 1)
    out = [(d, min(_base_step(state, knob, d) * f, reach)) for f in ladder for d in (1, -1)]
    best = model.best_x(MAX_STEP)
    if best is not None and abs(best) >= state.min_step:
        out.insert(0, (1 if best > 0 else -1, abs(best)))
    return out


def _fresh(state: SearchState, change: Change) -> bool:
    return change.new != change.old and change not in state.tried and \
        config_key(state, (change,)) not in state.evaluated


def candidates(state: SearchState, knob: KnobValue, model: Effect | Switch) -> list[Change]:
    """Untried values for one knob, outside crashed regions, most considered first."""
    if isinstance(model, Switch):
        direction = -1 if switched_on(knob.raw) else 1
        literal = moved(knob, direction, FIRST_STEP)
        change = Change(knob.name, knob.raw, literal) if literal else None
        ok = change is not None and (knob.name, direction) not in state.banned
        return [change] if ok and change is not None and _fresh(state, change) else []
    out: list[Change] = []
    for direction, step in _steps(state, knob, model):
        if (knob.name, direction) in state.banned or step < state.min_step:
            continue
        literal = moved(knob, direction, step)
        literal = literal and _bounded(state, knob, direction, literal)
        change = Change(knob.name, knob.raw, literal) if literal else None
        if change is not None and change not in out and _fresh(state, change):
            out.append(change)
    return out


def predicted(model: Effect | Switch, knob: KnobValue, change: Change,
              coef: tuple[float, float] | float | None = None) -> float:
    """Predicted improvement of a change (mean model, or the sampled coefficients)."""
    if isinstance(model, Switch):
        c = model.mean() if coef is None else float(coef)  # type: ignore[arg-type]
        return -c * (switched_on(change.new) - switched_on(change.old))
    x = (coordinate_of(knob.scale, change.new) or 0.0) - (
        coordinate_of(knob.scale, knob.raw) or 0.0)
    return model.gain(x, coef if isinstance(coef, tuple) else None)


def _kind(state: SearchState, change: Change, mean: float) -> str:
    last = state.last_keep.get(change.name)
    if last is not None and last.new == change.old and last.direction == change.direction:
        return "momentum"
    return "exploit" if mean > 0 else "explore"


def model_moves(state: SearchState, knobs: list[KnobValue], rng: random.Random,
                blocked: set[Category]) -> list[Move]:
    """Thompson sampling: one posterior draw per knob, every candidate scored under it."""
    resting = _knobs_to_rest(state)
    moves = []
    for knob in knobs:
        category = category_of_knob(knob.name)
        if category in blocked or knob.name in state.set_aside:
            continue
        model = fit(knob, state.items, state.scale, state.generation)
        coef = model.sample(rng)
        for change in candidates(state, knob, model):
            mean = predicted(model, knob, change)
            score = predicted(model, knob, change, coef) / state.scale
            score -= RESTING_PENALTY if knob.name in resting else 0.0
            kind = _kind(state, change, mean)
            moves.append(Move((change,), kind, score,
                              f"{kind}: expected gain {mean:+.3g} against a typical gain "
                              f"of {state.scale:.2g}, from {model.n:.1f} runs that moved "
                              f"{knob.name} (older runs count less)",
                              category, {"predicted_gain": round(mean, 9)}))
    return sorted(moves, key=lambda m: -m.score)


def _applies(state: SearchState, change: Change) -> bool:
    return state.head.get(change.name) == change.old


def _promising_misses(state: SearchState, min_delta: float) -> list[Trial]:
    """Near-misses whose gain was more than their noise (a run that saw nothing is no lead)."""
    return [t for t in near_misses(state.items, min_delta) if promising(t, min_delta)]


def retest_moves(state: SearchState, knobs: dict[str, KnobValue], min_delta: float,
                 blocked: set[Category]) -> list[Move]:
    """Near-misses from an older head, tried again at half their step on the current head
    (the same lines again would be refused as a duplicate)."""
    if state.stall < RETEST_AFTER:
        return []
    retested = {t.meta.get("retest_of") for t in state.items}
    out = []
    for t in _promising_misses(state, min_delta):
        c = single(t)
        if c is None or t.generation >= state.generation or t.id in retested:
            continue
        knob = knobs.get(c.name)
        if knob is None or not _applies(state, c) or not c.step or \
                category_of_knob(c.name) in blocked:
            continue
        literal = moved(knob, c.direction, c.step / 2) if c.step / 2 >= MIN_STEP else None
        literal = literal and _bounded(state, knob, c.direction, literal)
        change = Change(c.name, c.old, literal) if literal and literal != c.old else None
        if change is None or not _fresh(state, change) or not safe(state, change):
            continue
        out.append(Move((change,), "retest", t.gain or 0.0,
                        f"retest: near-miss #{t.id} ({c.name} {c.old} -> {c.new}, "
                        f"gain {t.gain or 0:+.4g}) from an older head, at half its step",
                        category_of_knob(c.name), {"retest_of": t.id}))
    return out[:1]


def combine_moves(state: SearchState, min_delta: float, blocked: set[Category]) -> list[Move]:
    """Two near-misses on different knobs as one change, once single changes have stalled."""
    if state.stall < COMBINE_AFTER or (state.items and state.items[-1].meta.get("move") ==
                                       "combine"):
        return []
    singles = [(t, c) for t in _promising_misses(state, min_delta)
               if (c := single(t)) is not None and _applies(state, c) and safe(state, c)
               and category_of_knob(c.name) not in blocked]
    best: dict[str, tuple[Trial, Change]] = {}
    for t, c in singles:
        best.setdefault(c.name, (t, c))
    out = []
    for (t1, c1), (t2, c2) in combinations(best.values(), 2):
        changes = (c1, c2)
        if config_key(state, changes) in state.evaluated or frozenset(changes) in state.tried_sets:
            continue
        score = (t1.gain or 0.0) + (t2.gain or 0.0)
        out.append(Move(changes, "combine", score,
                        f"combine near-misses #{t1.id} and #{t2.id} after {state.stall} runs "
                        "without a keep", category_of_knob(c1.name),
                        {"combines": [t1.id, t2.id]}))
    return sorted(out, key=lambda m: -m.score)[:2]


def ranked_moves(head: list[KnobValue], items: list[Trial], *, seed: int, min_delta: float = 0.0,
                 blocked: set[Category] | None = None) -> tuple[SearchState, list[Move]]:
    """Every candidate move, best first: combinations on a stall, then a near-miss re-test,
    then the bandit's arms by their sampled score."""
    blocked = blocked or set()
    state = read_state({k.name: k.raw for k in head}, items, min_delta)
    rng = random.Random(f"{seed}:{len(items)}:{state.generation}")
    knobs = {k.name: k for k in head}
    special = (combine_moves(state, min_delta, blocked)
               + retest_moves(state, knobs, min_delta, blocked))
    moves = model_moves(state, head, rng, blocked)
    if not moves and state.set_aside:  # out of moves: the knobs set aside come back first
        state.set_aside = set()
        moves = model_moves(state, head, rng, blocked)
    for _ in range(3):  # still none: look closer and further rather than stop
        if moves:
            break
        state.min_step /= 4
        state.reach *= 2
        moves = model_moves(state, head, rng, blocked)
    return state, special + moves


def plateau_status(state: SearchState) -> str:
    if state.stall >= PLATEAU_AFTER:
        return (f"plateau: {state.stall} runs without a keep (switching knobs, bigger steps, "
                "combining near-misses)")
    if state.stall >= COMBINE_AFTER:
        return f"stalling: {state.stall} runs without a keep (combining near-misses)"
    return f"{state.stall} runs since the last keep"
