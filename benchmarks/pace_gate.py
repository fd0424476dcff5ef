"""PACE, a peer of the keep rule in its own worlds: a paired anytime-valid e-process commit gate
(benchmarks/keep_rule.py --pace, --heldout --pace, --night budget --pace).

An adaptation from the description only (arXiv 2606.08106, "a paired anytime-valid e-process
commit gate, ~18 % fewer evaluations than a fixed-n gate"; the paper could not be read): what
the name says, built from standard parts, not its authors' code or settings.

The gate. A change runs in pairs: a run of the change, then a run of the incumbent beside it
with the same seed (the same machine condition). After pair n, with d_i = incumbent − change
(the metric is minimised: d > 0 is a gain), the e-process E_n for H0: E[d] ≤ 0 is the Bayes
factor of the one-sample t-test on d/√2 with the night's noise before the change as prior
degrees of freedom: a half-normal prior of scale `spread` (in σ of one run) on the gain, the
right-Haar prior 1/σ on σ. In closed form, with ν = ν0 + n − 1 (ν0: the degrees of freedom
of σ̂ pooled within the night's earlier commits and conditions, agent.rules.placement), t the
t-statistic of d on σ̂ with ν df, g = spread²/2, c = ng/(1 + ng), q = t²/(ν + t²):

    E_n = 2 (1 + ng)^(-1/2) (1 − cq)^(-(ν+1)/2) F_{ν+1}(sign(t) √((ν + 1) cq / (1 − cq)))

(F: Student's t CDF; the same integral done numerically agrees: tests/test_benchmarks.py).
Why it is an e-process: by scale invariance, a right-Haar Bayes factor is a test martingale in
the filtration of the scale-free statistics under the null (Pérez-Ortiz, Lardy, de Heide and
Grünwald, "E-statistics, group invariance and anytime-valid testing", 2024), for normal noise
and a change that does nothing; E_n rises with t, and t falls as every d falls, so a harmful
change crosses no more often. By Ville's inequality P(E_n ≥ 1/α for some n) ≤ α: the gate
**commits** (keeps) the moment E_n ≥ 1/α, and after `max_pairs` pairs it **holds** (a
discard that is no evidence of no effect). No futility stop: the description names a commit
gate whose saving is stopping when the evidence is in; a stop for futility would only lower
its error, and is not part of it. σ̂'s prior is fixed before the change's first pair
(predictable); the night shares it across changes, so each test is valid on its own, not
independent of the others.

The level: `ledger = "fixed"`, α = 0.05 for every test (the plain commit gate); `"e-lond"`,
the night's FDR held by e-LOND (Xu and Ramdas, 2024: test j keeps when E ≥ 1/α_j, α_j =
fdr·γ_j·(keeps before + 1), γ_j the LOND default 0.0772·log(max(j, 2))/(j·e^√log j)), valid
under any dependence, at the rule's own target (fdr = 0.2).

The night is keep_world's (or curve_world's budget night): the baseline by decide() as for the
rule, runs and incumbent runs beside a change counted alike, the incumbent re-run when due.
Noise that is not normal (t3, spikes), changes that change σ, and loss of the pair's shared
condition (a load change between its runs) are outside the guarantee: the held-out rows show
what they cost.
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from curve_world import BudgetNight, CurveTally, CurveWorld, Policy, simulate_budget  # noqa: E402
from keep_world import Commit, Night, Tally, World, simulate  # noqa: E402

from agent.rules.decide import Rule  # noqa: E402
from agent.rules.noise import t_sf  # noqa: E402
from agent.rules.placement import noise_part  # noqa: E402

SPREAD = 2.0  # the prior's scale of a gain, in σ of one run: keep_world's gains are U(0.5, 4)σ
LOND_C = 0.07720838  # the LOND default sequence's constant (Javanmard and Montanari, 2018)


@dataclass(frozen=True)
class Pace:
    """The gate's settings: its level, its ledger, the most pairs a change gets, the prior."""

    alpha: float = 0.05  # "fixed": every test's level; "e-lond": the night's FDR
    max_pairs: int = 1
    ledger: str = "fixed"  # or "e-lond"
    spread: float = SPREAD


# the rows printed (benchmarks/keep_rule.py --pace): 1 pair spends about the rule's runs a
# proposal (2 against its ~1.5); 4 pairs is the rule's most runs of a change
PEERS = {
    "PACE α=.05, 1 pair": Pace(0.05, 1),
    "PACE α=.05, 4 pairs": Pace(0.05, 4),
    "PACE e-LOND, 1 pair": Pace(0.2, 1, "e-lond"),
    "PACE e-LOND, 4 pairs": Pace(0.2, 4, "e-lond"),
}


def e_value(diffs: list[float], prior_ss: float, prior_df: int, spread: float = SPREAD) -> float:
    """E_n after the pairs' differences `diffs` (incumbent − change: > 0 is a gain), given the
    night's squared deviations of single runs from their commit's mean `prior_ss` on
    `prior_df` degrees of freedom (the module docstring's formula). 1 with no σ̂ at all."""
    n = len(diffs)
    nu = prior_df + n - 1
    if n == 0 or nu <= 0:
        return 1.0
    x = [d / math.sqrt(2.0) for d in diffs]  # one run's σ: a pair's difference has √2 σ
    mean = sum(x) / n
    ss = prior_ss + sum((v - mean) ** 2 for v in x)
    if ss <= 0:
        return math.inf if mean > 0 else 1.0
    t = math.sqrt(n) * mean / math.sqrt(ss / nu)
    g = spread * spread / 2.0
    c, q = n * g / (1 + n * g), t * t / (nu + t * t)
    tail = 1.0 - t_sf(math.copysign(math.sqrt((nu + 1) * c * q / (1 - c * q)), t), nu + 1)
    if tail <= 0.0:
        return 0.0
    return math.exp(math.log(2.0 * tail) - 0.5 * math.log1p(n * g)
                    - (nu + 1) / 2 * math.log1p(-c * q))


def lond_gamma(j: int) -> float:
    """γ_j of e-LOND's default sequence (Σγ ≤ 1), j from 1."""
    return LOND_C * math.log(max(j, 2)) / (j * math.exp(math.sqrt(math.log(j))))


class PaceGate:
    """The gate in place of decide() for a change (mixed into a night: Night or BudgetNight)."""

    rule: Rule
    head: Commit
    others: tuple[float, int]
    beside: int

    def __init__(self, *args: object, pace: Pace, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self.pace, self.tested, self.commits = pace, 0, 0

    def level(self) -> float:
        """The next test's α: fixed, or e-LOND's from the tests and keeps before it."""
        p = self.pace
        if p.ledger == "e-lond":
            return p.alpha * lond_gamma(self.tested + 1) * (self.commits + 1)
        return p.alpha

    def settle(self, c: Commit, baseline: bool) -> bool:
        """The baseline as the rule's night runs it; a change in pairs until E_n ≥ 1/α (kept)
        or `max_pairs` pairs (held: discarded)."""
        if baseline:
            return super().settle(c, baseline)  # type: ignore[misc, no-any-return]
        self.verdict = None
        night: Night = self  # type: ignore[assignment]
        prior_ss, prior_df = self.others
        ss, df = noise_part(self.head.runs, night.tolerance())  # fixed before the first pair
        bar, diffs, kept = 1.0 / self.level(), [], False
        for i in range(self.pace.max_pairs):
            seed = self.rule.seed + i
            run = night.measure(c, seed)
            c.runs.append(run)
            c.suspect.append(False)
            beside = night.measure(self.head, seed, run.run_id, c)
            self.head.runs.append(beside)
            self.head.suspect.append(False)
            self.beside += 1
            diffs.append(beside.metric - run.metric)
            if e_value(diffs, prior_ss + ss, prior_df + df, self.pace.spread) >= bar:
                kept = True
                break
        self.tested += 1
        self.commits += kept
        return kept


class PaceNight(PaceGate, Night):
    """keep_world's night of 100 proposals, each settled by the gate."""


class PaceBudgetNight(PaceGate, BudgetNight):
    """curve_world's fixed-budget night, each change settled by the gate (no early stop: every
    run costs a full run, the incumbent's beside a change too)."""


def simulate_pace(pace: Pace, world: World, sweeps: int, seed: int) -> Tally:
    """The gate's nights, paired with keep_world.simulate(Rule(), ..., paired=True): the same
    changes in the same order, the same machine phases."""
    return simulate(Rule(), world, sweeps, seed, paired=True, night=partial(PaceNight, pace=pace))


def simulate_pace_budget(pace: Pace, world: CurveWorld, sweeps: int, seed: int) -> CurveTally:
    """The gate on the budget night, on the changes and seeds every rule meets there."""
    return simulate_budget(Rule(), world, Policy(), sweeps, seed,
                           night=partial(PaceBudgetNight, pace=pace))


def null_keep_rate(pace: Pace, tests: int, seed: int, baseline_runs: int = 5,
                   gate: object = None) -> float:
    """The gate's keep rate on `tests` null changes with stationary N(0, 1) noise, each with a
    fresh σ̂ from `baseline_runs` runs (tests/test_benchmarks.py: at most α when valid).
    `gate(diffs, ss, df) -> E` replaces e_value (a test shows a naive gate fails)."""
    e_of = gate or (lambda d, ss, df: e_value(d, ss, df, pace.spread))
    rng, kept = random.Random(seed), 0
    for _ in range(tests):
        base = [rng.gauss(0.0, 1.0) for _ in range(baseline_runs)]
        mean = sum(base) / baseline_runs
        ss, df = sum((v - mean) ** 2 for v in base), baseline_runs - 1
        diffs: list[float] = []
        for _ in range(pace.max_pairs):
            diffs.append(rng.gauss(0.0, 1.0) - rng.gauss(0.0, 1.0))
            if e_of(diffs, ss, df) >= 1 / pace.alpha:  # type: ignore[operator]
                kept += 1
                break
    return kept / tests
