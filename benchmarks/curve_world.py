"""A fixed-budget night with loss curves: every rule gets the same GPU-seconds, a run stopped
early costs only the share of the budget it trained (benchmarks/keep_rule.py --night budget).

The curve model, in units of σ (the seed-to-seed sd of the final metric): a run's training loss
at budget fraction f is L(f) + Δ(f) + e(f) + ε, logged every `step` of the budget, where

- L(f) = level + drop·level·(exp(−f/τ) − exp(−1/τ)): the incumbent's mean curve, ending at
  `level` (300σ: the seed noise is a third of a percent of the final loss, as in nanoGPT-sized
  runs), five times higher at the start;
- Δ(f) is the sum of the commit's kept changes' shapes (below), Δ(1) its true effect;
- e(f) is the seed's noise, correlated along the curve: sd(f)·(√ρ·Z + √(1 − ρ)·OU(f)), an
  offset shared by the whole curve plus an Ornstein–Uhlenbeck wander of correlation length
  `ou_length`; sd(1) = σ and sd grows early (`early_spread`); the final metric is truth + e(1);
- ε ~ N(0, point_noise) per logged point (a smoothed training loss, as autoresearch prints).

Changes: the effect mix of keep_world (70 % null, 20 % harmful, 10 % helpful, U(0.5, 4)
effect units), each with a shape: `early` (a constant offset from the start), `late` (e·f:
grows with training) or `crossing` (a schedule knob: a hump of the other sign, U(1, 8)σ at its
height, before the crossing at U(0.5, 0.75) of the budget, then e at the end: a win that looks
behind mid-run). Crossing changes are categorised data/schedule (`labelled` of them; the rest
are e.g. a bigger model, behind early, ahead late, in another category); a fifth of the nulls
are schedule knobs with a hump and no effect at the end.

The night is keep_world's (the real agent.rules.decide.decide drives every verdict) with a
budget: it ends when the GPU-seconds are spent (an undecided experiment is not kept); a change's
run may be stopped at agent.rules.prune's checks (clearly behind over a part of the budget, the
budget cut into the rule's max_runs parts as in the engine), which discards the change;
incumbent and baseline runs are never stopped. As in the engine, the spread pools every earlier
incumbent's curves.

A promotion ladder (`Policy(ladder=Ladder(...))`, issue #52 item 2; a spike, no product code):
a change's first run is a screen, a run of its own seed trained to a fraction f of the budget
(it costs f), judged by agent.rules.prune.check at f against the incumbent's curves there at a
stated level γ; only a promoted change gets full-budget runs, and decide() keeps or discards it
on those alone (the screen's run is not one of them: its seed's offset would bias the first).
Exempt categories (the early stop's: data/schedule and optimizer, curves that cross late) and runs
off the incumbent's speed skip the screen, as check() does not judge them.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from keep_world import Commit, Night, Tally, World, _effect

from agent.rules.categories import Category
from agent.rules.decide import Rule, incumbent_due, stop_level
from agent.rules.noise import speed_tolerance
from agent.rules.placement import Sample
from agent.rules.prune import PrunePolicy, check, loss_over

SCHEDULE = Category.DATA_SCHEDULE.value
OTHERS = tuple(c.value for c in Category if c is not Category.DATA_SCHEDULE)


@dataclass(frozen=True)
class CurveWorld:
    name: str = "curves σ=1"
    sigma: float = 1.0
    level: float = 300.0  # final training loss, in σ
    drop: float = 4.0  # L(0) − L(1) in units of the level
    tau: float = 0.2
    seed_share: float = 0.5  # ρ: the share of the seed's variance that is one offset
    ou_length: float = 0.3
    early_spread: float = 1.0  # the seed's sd at f=0 is (1 + this)× its sd late
    point_noise: float = 1.0  # per logged point, in σ
    step: float = 0.01  # a progress line every 1 % of the budget
    # each run's lines every k steps, k drawn from this range, at a random phase (a real script
    # prints every few seconds: runs' lines fall at their own steps); (1, 1): every step
    lines: tuple[int, int] = (1, 1)
    shapes: tuple[float, float, float] = (0.4, 0.35, 0.25)  # early, late, crossing
    labelled: float = 0.8  # crossing changes categorised data/schedule
    slower: float = 0.5  # of the other crossing changes (a bigger model), those 10–40 % slower
    speed_changes: float = 0.3  # of the early and late changes, those that change the speed
    tp_noise: float = 0.02  # run-to-run spread of the throughput (log scale)
    null_humps: float = 0.2  # nulls that are schedule knobs with a hump
    broken: float = 0.0  # of the harmful changes, those broken (20–200σ worse from the start)
    budget: float = 100.0  # GPU-seconds, in full runs
    grid: tuple[float, ...] = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)  # where "behind" is tallied

    def fractions(self) -> tuple[float, ...]:
        """The logged fractions: a progress line every `step` of the budget, to the end."""
        return tuple(round(j * self.step, 6) for j in range(1, round(1 / self.step) + 1))


@dataclass(frozen=True)
class Change:
    effect: float  # Δ(1), σ; negative = better
    shape: str  # "none", "early", "late", "crossing"
    category: str
    hump: float = 0.0  # crossing: Δ's height before the crossing (sign: behind = +)
    cross: float = 0.6
    speed: float = 1.0  # its throughput over its parent's

    def delta(self, f: float) -> float:
        if self.shape == "early":
            return self.effect
        if self.shape == "late":
            return self.effect * f
        if self.shape == "crossing":
            if f < self.cross:
                return self.hump * math.sin(math.pi * f / self.cross)
            return self.effect * math.sin(math.pi / 2 * (f - self.cross) / (1 - self.cross))
        return 0.0


def draw_change(world: CurveWorld, rng: random.Random) -> Change:
    effect = _effect(rng) * world.sigma
    if effect == 0:
        if rng.random() < world.null_humps:
            return Change(0.0, "crossing", SCHEDULE, rng.choice((-1, 1)) * rng.uniform(1, 8),
                          rng.uniform(0.5, 0.75))
        return Change(0.0, "none", rng.choice(OTHERS))
    u = rng.random()
    if effect > 0 and world.broken and rng.random() < world.broken:
        return Change(rng.uniform(20, 200) * world.sigma, "early", rng.choice(OTHERS))
    early, late, _ = world.shapes
    if u < early:
        return Change(effect, "early", rng.choice(OTHERS), speed=_speed(world, rng))
    if u < early + late:
        return Change(effect, "late", rng.choice(OTHERS), speed=_speed(world, rng))
    hump = -math.copysign(rng.uniform(1, 8), effect) * world.sigma
    cross = rng.uniform(0.5, 0.75)
    if rng.random() < world.labelled:
        return Change(effect, "crossing", SCHEDULE, hump, cross)
    # e.g. a bigger model: behind early for fewer steps, ahead late; mostly slower
    speed = rng.uniform(0.6, 0.9) if rng.random() < world.slower else 1.0
    return Change(effect, "crossing", Category.ARCHITECTURE.value, hump, cross, speed)


def _speed(world: CurveWorld, rng: random.Random) -> float:
    """keep_world's: 30 % of the changes that do something change the speed ×U(0.7, 1.3)."""
    return rng.uniform(0.7, 1.3) if rng.random() < world.speed_changes else 1.0


@dataclass
class CurveTally(Tally):
    spent: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("null", "harmful", "helpful", "incumbent"), 0.0))
    stopped: dict[str, int] = field(default_factory=lambda: {"check": 0})
    helpful: int = 0
    helpful_stopped: int = 0
    big_stopped: int = 0
    # (shape or "all", f): [behind the incumbent's mean, seen], first runs of winners
    behind: dict[tuple[str, float], list[int]] = field(default_factory=dict)
    finished_nights: int = 0
    stops: dict[str, int] = field(default_factory=dict)  # "helpful crossing": stopped changes
    # the ladder: by kind ("null", "harmful", "helpful"), changes screened and those not promoted
    screens: dict[str, int] = field(default_factory=dict)
    screened_out: dict[str, int] = field(default_factory=dict)
    lost_keeps: int = 0  # winners screened out that the night would have kept without the screen
    lost_big: int = 0  # of those, gains ≥ 3σ


@dataclass(frozen=True)
class Ladder:
    """The screen: a run to `fraction` of the budget (one of the early stop's checks, j/K, read
    over the part of the budget that check reads), promoted unless behind the incumbent there
    with P(T ≤ t) ≤ `level` (check()'s test at that level). Its error, by construction: a change
    no worse than the incumbent at the fraction is screened out with probability at most
    `level` (exactly `level` for one equal to it there); what it costs a change that wins at the
    end depends on how far ahead it is at the fraction, which is why the exempt categories are
    not screened."""

    fraction: float = 0.25
    level: float = 0.5
    oracle: bool = False  # a diagnostic: winners are always promoted (no real screen can)


@dataclass
class Policy:
    """Whether the night stops clearly losing runs early (agent.rules.prune), and where; whether
    a change is screened short first (a Ladder)."""

    prune: PrunePolicy | None = None
    ladder: Ladder | None = None


class BudgetNight(Night):
    """keep_world's night on curves, until the budget is spent."""

    def __init__(self, rule: Rule, world: CurveWorld, policy: Policy, key: int) -> None:
        # common random numbers: proposal k and run j of commit k draw from streams keyed by
        # (sweep, k, j), so every rule meets the same changes and the same seeds' noise
        super().__init__(rule, World(world.name, sigma=world.sigma, source=None),
                         random.Random(key))
        self.key = key * 1_000_000
        self.serial: dict[int, int] = {self.head.key: 0}
        self.cw, self.policy = world, policy
        if policy.prune is not None:  # as the engine: the budget in max_runs parts
            self.policy = replace(policy, prune=replace(policy.prune, looks=rule.max_runs))
        self.grid = world.fractions()
        self.base = [self._level(f) for f in self.grid]
        self.spent, self.kind = 0.0, "incumbent"
        self.curves: dict[int, list[list[tuple[float, float]]]] = {}  # commit key: its curves
        self.past: list[list[list[tuple[float, float]]]] = []  # earlier incumbents', newest first
        self._last_e = 0.0  # the last run's final-metric noise
        self.means: dict[int, list[float]] = {self.head.key: self.base}
        self.change: Change | None = None
        self.screen = PrunePolicy(looks=rule.max_runs)  # the ladder's fractions: the same cut
        if policy.ladder is not None and not any(
                abs(f - policy.ladder.fraction) < 1e-9 for f in self.screen.checks):
            raise ValueError(f"ladder: the fraction must be one of {self.screen.checks}")

    def _level(self, f: float) -> float:
        w = self.cw
        return w.level + w.drop * w.level * (math.exp(-f / w.tau) - math.exp(-1 / w.tau))

    def curve(self, c: Commit, j: int | None = None) -> tuple[list[tuple[float, float]], float]:
        """One run's logged curve and its final metric's noise e(1); `j`: the run's stream (by
        default its index among the commit's runs; the ladder's screen has one of its own)."""
        w = self.cw
        j = len(c.runs) if j is None else j
        rng = random.Random(self.key + self.serial[c.key] * 64 + j)
        z, o, prev = rng.gauss(0, 1), rng.gauss(0, 1), 0.0
        norm = 1 + w.early_spread * math.exp(-1 / w.tau)
        mean, points, e = self.means[c.key], [], 0.0
        for f, m in zip(self.grid, mean, strict=True):
            a = math.exp(-(f - prev) / w.ou_length)
            o, prev = a * o + math.sqrt(1 - a * a) * rng.gauss(0, 1), f
            sd = w.sigma * (1 + w.early_spread * math.exp(-f / w.tau)) / norm
            e = sd * (math.sqrt(w.seed_share) * z + math.sqrt(1 - w.seed_share) * o)
            points.append((f, m + e + rng.gauss(0, w.point_noise)))
        if w.lines != (1, 1):  # its own stream: the default world's draws are untouched
            own = random.Random(f"lines-{self.key + self.serial[c.key] * 64 + j}")
            k = own.randint(*w.lines)
            phase = own.randrange(k)
            last = len(points) - 1
            points = [p for i, p in enumerate(points) if i in (0, last) or i % k == phase]
        return points, e

    def measure(self, c: Commit, seed: int, pair_of: int | None = None,
                beside: Commit | None = None) -> Sample:
        if self.spent >= self.cw.budget:
            raise _Spent
        points, e = self.curve(c)
        self._last_e = e
        run = Sample(c.truth + e, None, self.next_id, seed, None, pair_of, None)
        self.next_id += 1
        self.runs += 1
        cost = 1.0
        if c is not self.head and self.kind != "incumbent":
            cost = self._judge(c, points, len(c.runs))
        self.spent += cost
        self.tally_spent[self.kind if c is not self.head else "incumbent"] += cost
        if cost < 1.0:
            raise _Stopped
        self.curves.setdefault(c.key, []).append(points)
        return run

    def _judge(self, c: Commit, points: list[tuple[float, float]], k: int) -> float:
        """The share of the budget this change's run trains before it is stopped (1: never)."""
        pol, change = self.policy.prune, self.change
        assert change is not None
        incumbents = self.curves.get(self.head.key, [])
        if k == 0:
            self._looked_behind(points, incumbents)
        if pol is None:
            return 1.0
        ratio = c.speed / self.head.speed * math.exp(self.rng.gauss(0, self.cw.tp_noise))
        off = abs(ratio - 1) > speed_tolerance(self.cw.tp_noise)
        level = stop_level(self.rule)
        for i, f in enumerate(pol.checks):
            call = check(points, incumbents, i, level, pol, category=change.category,
                         speed_off=off, earlier=self.past)
            if call.stop:
                self.stopped = "check"
                return f
        return 1.0

    def _promoted(self, c: Commit, tally: CurveTally) -> bool:
        """The ladder's screen: True when the change goes on to full-budget runs."""
        lad, change = self.policy.ladder, self.change
        assert change is not None
        if lad is None or change.category in self.screen.exempt:
            return True
        if self.spent >= self.cw.budget:
            raise _Spent
        own = random.Random(self.key + self.serial[c.key] * 64 + 62)  # the night's rng untouched
        ratio = c.speed / self.head.speed * math.exp(own.gauss(0, self.cw.tp_noise))
        if abs(ratio - 1) > speed_tolerance(self.cw.tp_noise):
            return True  # check() would not judge it: its curve measures the machine
        points, _ = self.curve(c, j=63)  # a seed of its own, not one of the keep's runs
        self.spent += lad.fraction
        self.tally_spent[self.kind] += lad.fraction
        for what in (self.kind, f"{self.kind} {change.shape}"):
            tally.screens[what] = tally.screens.get(what, 0) + 1
        index = self.screen.checks.index(
            min(self.screen.checks, key=lambda f: abs(f - lad.fraction)))
        call = check(points, self.curves.get(self.head.key, []), index, lad.level,
                     self.screen, earlier=self.past)
        if not call.stop or (lad.oracle and change.effect < 0):
            return True
        for what in (self.kind, f"{self.kind} {change.shape}"):
            tally.screened_out[what] = tally.screened_out.get(what, 0) + 1
        if change.effect < 0 and self._would_keep(c):
            tally.lost_keeps += 1
            tally.lost_big += -change.effect >= 3 * self.cw.sigma
        return False

    def _would_keep(self, c: Commit) -> bool:
        """Whether this night, as it stands, would have kept the change without the screen
        (given the GPU-seconds to decide it): a copy of the night decides it; this one is
        untouched."""
        shadow, twin = copy.deepcopy((self, c))
        shadow.cw = replace(self.cw, budget=math.inf)
        try:
            return shadow.settle(twin, baseline=False)
        except _Stopped:
            return False

    def _looked_behind(self, points: Sequence[tuple[float, float]],
                       incumbents: list[list[tuple[float, float]]]) -> None:
        """For a change that wins at the end: was its first run behind the incumbent's mean?"""
        if self.change is None or self.change.effect >= 0 or len(incumbents) < 2:
            return
        for f in self.cw.grid:
            mine = loss_over(points, (f - 0.05, f))  # the points of the 5 % before f
            ref = [v for c in incumbents if (v := loss_over(c, (f - 0.05, f))) is not None]
            if mine is not None and ref:
                for what in ("all", self.change.shape):
                    seen = self.tally.behind.setdefault((what, f), [0, 0])
                    seen[0] += mine > sum(ref) / len(ref)
                    seen[1] += 1

    def run(self, tally: Tally) -> None:
        assert isinstance(tally, CurveTally)
        self.tally, self.tally_spent = tally, tally.spent
        try:
            self.settle(self.head, baseline=True)
            k = 0
            while True:
                if self._due(k):
                    self.kind = "incumbent"
                    self.remeasure()
                    self.periodic += 1
                self.propose_at(tally, k)
                k += 1
        except _Spent:
            pass
        tally.gains.append(-self.head.truth / self.cw.sigma)
        tally.runs += self.runs
        tally.beside += self.beside
        tally.proposals += k
        tally.finished_nights += 1

    def _due(self, k: int) -> bool:
        return incumbent_due(k, self.periodic + self.beside, self.rule)

    def propose_at(self, tally: Tally, k: int) -> None:
        assert isinstance(tally, CurveTally)
        change = draw_change(self.cw, random.Random(self.key + 999_999 - k))
        effect = change.effect
        c = Commit(self.head.truth + effect, self.head.speed * change.speed)
        self.serial[c.key] = k + 1
        parent = self.means[self.head.key]
        self.means[c.key] = [m + change.delta(f) for f, m in zip(self.grid, parent, strict=True)]
        self.change, self.stopped = change, ""
        self.kind = "null" if effect == 0 else "harmful" if effect > 0 else "helpful"
        big = -effect >= 3 * self.cw.sigma
        try:
            kept = self._promoted(c, tally) and self.settle(c, baseline=False)
        except _Stopped:
            kept = False
            tally.stopped[self.stopped] += 1
            what = f"{self.kind} {change.shape}"
            tally.stops[what] = tally.stops.get(what, 0) + 1
            tally.helpful_stopped += effect < 0
            tally.big_stopped += big
        finally:
            self.kind = "incumbent"
        tally.count(effect, big, kept)
        tally.helpful += effect < 0
        if kept:
            self.retire(self.head)
            old = self.head.key
            self.past = [self.curves.get(old, []), *self.past]
            self.head = c
            for d in (self.means, self.curves, self.serial):
                d.pop(old, None)
        else:
            self.retire(c)
            for d in (self.means, self.curves, self.serial):
                d.pop(c.key, None)


class _Spent(Exception):
    """The night's GPU-seconds are spent."""


class _Stopped(Exception):
    """The change's run was stopped early: the change is discarded."""


def simulate_budget(rule: Rule, world: CurveWorld, policy: Policy, sweeps: int,
                    seed: int, night: Callable[..., BudgetNight] = BudgetNight) -> CurveTally:
    """`sweeps` budget nights; `night`: BudgetNight or a peer's subclass
    (benchmarks/pace_gate.py), built as BudgetNight is."""
    tally = CurveTally()
    for sweep in range(sweeps):
        night(rule, world, policy, seed * 100_003 + sweep).run(tally)
    return tally
