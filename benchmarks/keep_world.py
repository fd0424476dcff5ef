"""The simulated night behind benchmarks/keep_rule.py: commits with a true effect, a machine whose
load may change, and the loop's order of runs, all decided by the real agent.rules.decide.decide.

A world is stationary (every run: truth + N(0, σ)) or shifting: the machine alternates quiet
and busy phases of random length (busy 3–24 runs, i.e. several proposals; quiet spells twice
as long on average, so a third of the night is busy, or half in the harsh variant); a busy
phase of intensity k ~ U(`load`), U(2, 5) by default, makes every run k·σ worse and its
throughput k·`speed_per_sigma` slower (2–5σ and 10–25 % at the defaults). Throughput = the
commit's speed × the machine's factor × e^N(0, tp_noise); 30 % of the changes that do
something also change the speed (×U(0.7, 1.3)), as a change of model size does. The
throughput reaches the rule from the summary block, from progress lines (steps per second of
the last line: up to 2 s of a 300 s budget after it unseen, elapsed printed to 0.1 s) or not
at all.

The night is driven as agent.loop drives it: each experiment runs until decide() gives a
verdict; "run the incumbent beside run r" runs the best commit with run r's seed; run
statuses follow the verdict's suspect flags (the loop writes them to the store); σ̂'s prior is
the other commits' runs per condition; every `incumbent_every` proposals the best is re-run
(agent.engine.incumbent; the runs beside a change count), and the recorded best is the mean
of its runs in its usual condition.
"""

from __future__ import annotations

import itertools
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from agent.core.domain import ExperimentStatus
from agent.rules.decide import Evidence, Rule, Verdict, decide, incumbent_due
from agent.rules.noise import speed_noise, speed_tolerance
from agent.rules.placement import Sample, best_of, noise_part

PROPOSALS = 100
BUDGET_S, LINE_EVERY_S = 300.0, 2.0


@dataclass(frozen=True)
class World:
    name: str
    sigma: float = 1.0
    shifting: bool = False
    source: str | None = "summary"  # "summary", "progress" or None (no throughput at all)
    tp_noise: float = 0.02  # run-to-run spread of the throughput (log scale)
    speed_per_sigma: float = 0.05  # throughput lost per σ of a busy phase's metric shift
    speed_changes: float = 0.3  # share of the changes with an effect that change the speed
    busy_share: float = 1 / 3  # of the night's runs, on average
    load: tuple[float, float] = (2.0, 5.0)  # a busy phase's metric shift in σ: U(low, high)
    # held-out shapes (benchmarks/keep_rule.py --heldout; never tuned against): the seed
    # noise's shape ("normal", "t3": Student t with 3 df scaled to σ, "spikes": normal plus,
    # in 3 % of runs, a loss spike U(3, 10)σ worse), changes that change the noise (each
    # change with an effect multiplies σ by e^N(0, noise_spread)), a slow drift invisible to
    # the throughput (the metric's offset is a random walk of `drift` σ a run), and the mix
    # of changes ("default": keep_world's; "rare": 90 % null, 7 % harmful, 3 % helpful by
    # U(0.5, 2); "fresh": 50 % null, 30 % harmful U(0.2, 3), 20 % helpful Exp(mean 1))
    noise: str = "normal"
    noise_spread: float = 0.0
    drift: float = 0.0
    mix: str = "default"


@dataclass
class Tally:
    """A world's figures, summed over nights (`nights`: each night's (false keeps, keeps),
    for the FDR as defined, the mean over nights of false keeps / max(keeps, 1))."""

    nulls: int = 0
    null_keeps: int = 0
    keeps: int = 0
    false_keeps: int = 0
    big: int = 0
    big_keeps: int = 0
    runs: int = 0
    beside: int = 0  # incumbent runs started beside a change's run
    proposals: int = 0
    gains: list[float] = field(default_factory=list)
    biases: list[float] = field(default_factory=list)
    nights: list[tuple[int, int]] = field(default_factory=list)
    lost: list[tuple[Verdict, int]] = field(default_factory=list)  # ≥ 3σ gains not kept:
    # the final verdict, and how many of the runs it rested on met a busy phase

    def fdr(self) -> float:
        """E[false keeps / max(keeps, 1)] over the nights."""
        return statistics.fmean(v / max(r, 1) for v, r in self.nights) if self.nights else 0.0

    def count(self, effect: float, big: bool, kept: bool) -> None:
        """One decided proposal: its kind, and whether (and how wrongly) it was kept."""
        self.nulls += effect == 0
        self.big += big
        if kept:
            self.keeps += 1
            self.null_keeps += effect == 0
            self.false_keeps += effect >= 0
            self.big_keeps += big


class Machine:
    """Quiet and busy phases of random length; `tick` is one run's conditions."""

    def __init__(self, world: World, rng: random.Random) -> None:
        self.world, self.rng = world, rng
        self.busy = rng.random() < world.busy_share
        self.left = self._length()
        self.k = rng.uniform(*world.load)

    def _length(self) -> int:
        """A phase's length in runs: busy 3–24; quiet as long on average as busy_share says."""
        longer = (1 - self.world.busy_share) / self.world.busy_share
        return self.rng.randint(3, 24) if self.busy else round(self.rng.uniform(3, 24) * longer)

    def tick(self) -> tuple[float, float]:
        """(metric shift in σ, throughput factor) of the next run."""
        if not self.world.shifting:
            return 0.0, 1.0
        if self.left <= 0:
            self.busy, self.k = not self.busy, self.rng.uniform(*self.world.load)
            self.left = self._length()
        self.left -= 1
        if not self.busy:
            return 0.0, 1.0
        return self.k, 1.0 - self.k * self.world.speed_per_sigma


@dataclass
class Commit:
    truth: float
    speed: float = 1.0
    scale: float = 1.0  # its seed noise's σ, in units of the world's
    runs: list[Sample] = field(default_factory=list)
    suspect: list[bool] = field(default_factory=list)  # per run: its status in the store
    busy: int = 0  # its runs, and incumbent runs beside it, that met a busy phase
    lines: int = 0  # net lines it adds (< 0: a simplification; benchmarks/weigh_world.py)
    memory: float | None = None  # its peak memory, when the world has a cost (weigh_world)
    # who it is: id() is reused once a retired commit is freed (two commits then one, and the
    # night's numbers vary with the allocator); replace() keeps it (the same commit)
    key: int = field(default_factory=itertools.count().__next__)


class Night:
    """One simulated sweep for one rule in one world."""

    def __init__(self, rule: Rule, world: World, rng: random.Random,
                 effects: random.Random | None = None, machine: random.Random | None = None
                 ) -> None:
        # one stream for all by default; paired (simulate's `paired`): the changes' effects
        # and the machine's phases from streams of their own, so rules meet the same night
        self.rule, self.world, self.rng = rule, world, rng
        self.effects = effects or rng
        self.machine = Machine(world, machine or rng)
        self.head = Commit(0.0)
        self.others = (0.0, 0)  # squared_deviations() of retired commits' runs per condition
        self.next_id, self.runs, self.beside, self.periodic = 1, 0, 0, 0
        self.started: list[tuple[str, str | None, float | None]] = []  # commit, device, speed
        self.offset = 0.0  # the slow drift's current offset, in σ
        self.tests: list[tuple[float, bool]] = []  # the night's FDR ledger (p-value, kept)
        self.verdict: Verdict | None = None  # the latest experiment's final verdict

    def measure(self, c: Commit, seed: int, pair_of: int | None = None,
                beside: Commit | None = None) -> Sample:
        shift, factor = self.machine.tick()
        (beside or c).busy += shift > 0
        if self.world.drift:
            self.offset += self.rng.gauss(0.0, self.world.drift)
        noise = _noise(self.rng, self.world.noise) * c.scale
        metric = c.truth + (shift + self.offset + noise) * self.world.sigma
        speed = c.speed * factor * self.rng.lognormvariate(0.0, self.world.tp_noise)
        memory = () if c.memory is None else (
            ("memory", c.memory * self.rng.lognormvariate(0.0, 0.01)),)
        run = Sample(metric, self._seen(speed), self.next_id, seed, None, pair_of,
                     self.world.source, memory)
        self.started.append((str(c.key), None, run.throughput))
        self.next_id += 1
        self.runs += 1
        return run

    def _seen(self, speed: float) -> float | None:
        """The throughput as the rule gets it (see the module docstring)."""
        if self.world.source is None:
            return None
        if self.world.source == "summary":
            return speed
        lines = int(BUDGET_S / LINE_EVERY_S)  # steps per second of the last progress line
        elapsed = round(lines * LINE_EVERY_S - self.rng.uniform(0.0, LINE_EVERY_S), 1)
        return round(speed * elapsed) / elapsed

    def settle(self, c: Commit, baseline: bool) -> bool:
        """Run one commit until decide() gives a verdict; whether it was kept."""
        rule = self.rule
        c.runs.append(self.measure(c, rule.seed))
        while True:
            best = () if baseline else tuple(self.head.runs)
            ev = Evidence(baseline, tuple(c.runs), best, self.others,
                          speed_noise=speed_noise(self.started), tests=tuple(self.tests),
                          lines=c.lines)
            verdict = decide(ev, rule)
            c.suspect = list(verdict.suspect)
            if verdict.status is not None:
                self.verdict = verdict
                kept = verdict.status is ExperimentStatus.KEPT
                if verdict.p_value is not None:
                    self.tests.append((verdict.p_value, kept))
                return kept
            seed = verdict.seed if verdict.seed is not None else rule.seed + len(c.runs)
            if verdict.incumbent:
                self.head.runs.append(self.measure(self.head, seed, verdict.pair_of, c))
                self.head.suspect.append(False)
                self.beside += 1
            else:
                c.runs.append(self.measure(c, seed))

    def tolerance(self) -> float:
        return speed_tolerance(speed_noise(self.started))

    def remeasure(self) -> None:
        """agent.incumbent: one more run of the best; off its usual condition it is suspect."""
        h = self.head
        h.runs.append(self.measure(h, self.rule.seed + len(h.runs)))
        h.suspect = best_of(h.runs, self.tolerance())[1]

    def due(self, k: int) -> None:
        """The incumbent's re-run before proposal k, when due (every incumbent run counts,
        those beside a change too: agent.engine.incumbent)."""
        if incumbent_due(k, self.periodic + self.beside, self.rule):
            self.remeasure()
            self.periodic += 1

    def run(self, tally: Tally) -> None:
        before = (tally.false_keeps, tally.keeps)
        self.settle(self.head, baseline=True)
        for k in range(PROPOSALS):
            self.due(k)
            self.propose(tally)
        sigma = self.world.sigma
        tally.gains.append(-self.head.truth / sigma)
        recorded = best_of(self.head.runs, self.tolerance())[0]
        assert recorded is not None
        tally.biases.append((recorded - self.head.truth) / sigma)
        tally.nights.append((tally.false_keeps - before[0], tally.keeps - before[1]))
        tally.runs += self.runs
        tally.beside += self.beside
        tally.proposals += PROPOSALS

    def propose(self, tally: Tally) -> None:
        effect = _effect(self.effects, self.world.mix)
        speed, scale = self.head.speed, self.head.scale
        if effect and self.effects.random() < self.world.speed_changes:
            speed *= self.effects.uniform(0.7, 1.3)
        if effect and self.world.noise_spread:
            scale *= self.effects.lognormvariate(0.0, self.world.noise_spread)
        change = Commit(self.head.truth + effect, speed, scale)
        kept = self.settle(change, baseline=False)
        big = -effect >= 3 * self.world.sigma
        tally.count(effect, big, kept)
        if big and not kept and self.verdict is not None:
            tally.lost.append((self.verdict, change.busy))
        self.conclude(change, kept)

    def conclude(self, change: Commit, kept: bool) -> None:
        """After a change's verdict: kept, it is the new head (the old one retires); else it
        retires."""
        if kept:
            self.retire(self.head)
            self.head = replace(change, runs=list(change.runs), suspect=list(change.suspect))
        else:
            self.retire(change)

    def retire(self, c: Commit) -> None:
        """σ̂'s prior gains the commit's runs per condition (agent.rules.placement.noise_part, at
        the tolerance when it retires; the loop works it out again at each decision)."""
        if c is self.head:
            c.suspect = best_of(c.runs, self.tolerance())[1]
        ss, df = noise_part(c.runs, self.tolerance())
        self.others = (self.others[0] + ss, self.others[1] + df)


def _effect(rng: random.Random, mix: str = "default") -> float:
    """True change of the metric (minimised), in effect units: negative = better."""
    u = rng.random()
    if mix == "rare":
        if u < 0.9:
            return 0.0
        return rng.uniform(0.5, 4.0) if u < 0.97 else -rng.uniform(0.5, 2.0)
    if mix == "fresh":
        if u < 0.5:
            return 0.0
        return rng.uniform(0.2, 3.0) if u < 0.8 else -rng.expovariate(1.0)
    if u < 0.7:
        return 0.0
    size = rng.uniform(0.5, 4.0)
    return size if u < 0.9 else -size


def _noise(rng: random.Random, shape: str) -> float:
    """One run's seed noise in σ: normal, Student t with 3 df scaled to unit variance, or
    normal with a loss spike (a worse metric) in 3 % of runs."""
    if shape == "t3":
        return float(rng.gauss(0.0, 1.0) / (rng.gammavariate(1.5, 2.0) / 3.0) ** 0.5 / 3 ** 0.5)
    if shape == "spikes":
        spike = rng.uniform(3.0, 10.0) if rng.random() < 0.03 else 0.0
        return rng.gauss(0.0, 1.0) + spike
    return rng.gauss(0.0, 1.0)


def simulate(rule: Rule, world: World, sweeps: int, seed: int, paired: bool = False,
             night: Callable[..., Night] = Night) -> Tally:
    """`sweeps` nights from one seeded stream; `paired`: night i's effects, machine phases and
    run noise each from its own stream seeded by (seed, i), so two rules meet the same changes
    in the same order (a rule that spends other runs still meets the machine's phases at other
    runs: the pairing is of the changes, not of every draw). `night`: Night or a peer's
    subclass (benchmarks/pace_gate.py), built as Night is."""
    tally = Tally()
    if not paired:
        rng = random.Random(seed)
        for _ in range(sweeps):
            night(rule, world, rng).run(tally)
        return tally
    for i in range(sweeps):
        streams = (random.Random(f"{seed}-{i}-{part}") for part in ("noise", "effect", "machine"))
        night(rule, world, *streams).run(tally)
    return tally
