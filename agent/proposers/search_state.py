"""The search's view of a sweep's history: scale, crash regions, configurations run. Pure.

Built once per proposal by agent.proposers.policy from the constants at the sweep head and the
sweep's trials (agent.analysis.trials). Configurations are rebuilt from the kept diffs, so
"never the same configuration twice" holds for proposals from any source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.analysis.trials import Change, Trial, noise_scale, since_last_keep
from agent.rules.knob_space import MIN_STEP, coordinate, parse_literal

MAX_CRASHES_PER_ARM = 2  # after a crash one cautious retry that way, never a third
Config = tuple[int, frozenset[tuple[str, str]]]


@dataclass
class SearchState:
    """What the history says, computed once per proposal."""

    head: dict[str, str]  # name -> literal at the sweep head
    items: list[Trial]
    scale: float
    last_keep: dict[str, Change]  # knob -> its most recent kept change
    bounds: dict[tuple[str, int], float]  # (knob, direction) -> crashing coordinate
    banned: set[tuple[str, int]]  # bool/zero moves that crashed
    evaluated: set[Config]
    stall: int
    generation: int
    tried: set[Change] = field(default_factory=set)  # single changes already run
    tried_sets: set[frozenset[Change]] = field(default_factory=set)  # every change set run
    min_step: float = MIN_STEP
    reach: float = 1.0  # × MAX_STEP, widened when every closer value has been tried
    set_aside: set[str] = field(default_factory=set)  # knobs measured null both ways (null_knobs)


def single(t: Trial) -> Change | None:
    return t.changes[0] if t.pure and len(t.changes) == 1 else None


def measured_null(t: Trial, min_delta: float = 0.0) -> bool:
    """Its gain is within one standard error of zero (within min_delta where the noise was
    not measured): the run saw nothing."""
    return t.gain is not None and abs(t.gain) <= max(t.se or 0.0, min_delta)


def promising(t: Trial, min_delta: float = 0.0) -> bool:
    """Its gain is more than one standard error (and min_delta) above zero: the run saw
    something the keep rule did not confirm. Where the noise was not measured nothing tells a
    lead from noise, so any gain counts (the near-miss tolerance alone decides)."""
    return t.gain is not None and (t.se is None or t.gain > max(t.se, min_delta))


def null_knobs(head: dict[str, str], items: list[Trial], min_delta: float = 0.0) -> set[str]:
    """Knobs moved both ways from their present value (a switch: its one way), every such run
    measured null. On the search's local quadratic with a bowl's curvature, two runs that each
    saw nothing a step either side bound the knob's gain to about two standard errors anywhere
    within a ×4 move: less than the keep rule can confirm from a few runs."""
    ways: dict[str, set[int]] = {}
    saw_something: set[str] = set()
    for t in items:
        c = single(t)
        if c is None or t.gain is None or c.name not in head or not _same(c.old, head[c.name]):
            continue
        if not measured_null(t, min_delta):
            saw_something.add(c.name)
        ways.setdefault(c.name, set()).add(c.direction)
    return {name for name, found in ways.items()
            if name not in saw_something and _ways_from(head[name]) <= found}


def _same(a: str, b: str) -> bool:
    try:
        return parse_literal(a) == parse_literal(b)
    except ValueError:
        return a == b


def _ways_from(raw: str) -> set[int]:
    """The directions a knob can move from this literal: a switch only on or off."""
    try:
        value = parse_literal(raw)
    except ValueError:
        return {1, -1}
    if isinstance(value, bool):
        return {-1} if value else {1}
    return {1} if value == 0 else {1, -1}


def _crash_bounds(items: list[Trial]) -> tuple[dict[tuple[str, int], float],
                                              set[tuple[str, int]]]:
    """Per (knob, direction): the nearest coordinate that crashed as a one-constant change;
    a direction that was part of two crashed runs (or a flip that crashed) is banned."""
    bounds: dict[tuple[str, int], float] = {}
    seen: dict[tuple[str, int], int] = {}
    banned: set[tuple[str, int]] = set()
    for t in items:
        if t.crash is None or not t.pure or not 0 < len(t.changes) <= 2:
            continue
        for c in t.changes:
            key = (c.name, c.direction)
            seen[key] = seen.get(key, 0) + 1
            u = coordinate(c.name, c.new) if coordinate(c.name, c.old) is not None else None
            if seen[key] >= MAX_CRASHES_PER_ARM or (u is None and len(t.changes) == 1):
                banned.add(key)
            if u is not None and len(t.changes) == 1:
                bounds[key] = u if key not in bounds else (
                    min(bounds[key], u) if c.direction > 0 else max(bounds[key], u))
    return bounds, banned


def _configs_by_generation(head: dict[str, str], items: list[Trial]) -> list[dict[str, str]]:
    kept = [t for t in items if t.kept]
    configs = [dict(head)]
    for t in reversed(kept):
        before = dict(configs[0])
        before.update({c.name: c.old for c in t.changes})
        configs.insert(0, before)
    return configs


def _frozen(config: dict[str, str]) -> frozenset[tuple[str, str]]:
    """Constants by value, so 1.2e-2 and 0.012 are the same configuration."""
    out = set()
    for name, raw in config.items():
        try:
            out.add((name, repr(parse_literal(raw))))
        except ValueError:
            out.add((name, raw))
    return frozenset(out)


def _evaluated(head: dict[str, str], items: list[Trial]) -> set[Config]:
    """Every configuration run so far, keyed by (code generation, constants)."""
    configs = _configs_by_generation(head, items)
    code_gen, gens = 0, []
    kept_iter = iter(t for t in items if t.kept)
    for _ in configs:
        gens.append(code_gen)
        k = next(kept_iter, None)
        if k is not None and not k.pure:
            code_gen += 1
    out: set[Config] = {(gens[0], _frozen(configs[0]))}
    for t in items:
        if not t.pure or t.generation >= len(configs):
            continue
        cfg = dict(configs[t.generation])
        cfg.update({c.name: c.new for c in t.changes})
        out.add((gens[t.generation], _frozen(cfg)))
    out.add((gens[-1], _frozen(configs[-1])))
    return out


def _code_generation(items: list[Trial]) -> int:
    return sum(1 for t in items if t.kept and not t.pure)


def _first_scale(items: list[Trial], min_delta: float) -> float:
    """Before noise_scale can say: the median size of the gains seen so far."""
    gains = sorted(abs(t.gain) for t in items if t.gain is not None and t.gain != 0)
    return max(gains[len(gains) // 2] if gains else 1e-3, min_delta, 1e-12)


def read_state(head: dict[str, str], items: list[Trial], min_delta: float = 0.0) -> SearchState:
    scale = noise_scale(items, min_delta) or _first_scale(items, min_delta)
    generation = sum(1 for t in items if t.kept)
    last_keep = {}
    for t in items:
        c = single(t)
        if c is not None and t.kept:
            last_keep[c.name] = c
    bounds, banned = _crash_bounds(items)
    tried = {c for t in items if (c := single(t)) is not None}
    tried_sets = {frozenset(t.changes) for t in items if t.changes}
    return SearchState(head, items, scale, last_keep, bounds, banned, _evaluated(head, items),
                       since_last_keep(items), generation, tried, tried_sets,
                       set_aside=null_knobs(head, items, min_delta))



def config_key(state: SearchState, changes: tuple[Change, ...]) -> Config:
    cfg = dict(state.head)
    cfg.update({c.name: c.new for c in changes})
    return _code_generation(state.items), _frozen(cfg)




def beyond(state: SearchState, name: str, direction: int, literal: str) -> bool:
    """True when a value is at or past a coordinate that crashed moving this way."""
    bound, u = state.bounds.get((name, direction)), coordinate(name, literal)
    return bound is not None and u is not None and (u - bound) * direction >= 0




def safe(state: SearchState, change: Change) -> bool:
    """Not banned and not into a region that crashed."""
    key = (change.name, change.direction)
    return key not in state.banned and not beyond(state, change.name, change.direction,
                                                   change.new)
