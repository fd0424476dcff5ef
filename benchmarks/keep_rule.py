"""Monte Carlo of a 100-proposal night: how often each keep rule keeps noise, via the real decide().

Each sweep: a baseline, then proposals whose true effect on the head is 0 (70 %), harmful
(20 %: worse by U(0.5, 4) effect units) or helpful (10 %: better by U(0.5, 4)); every run
measures truth + N(0, σ). Each rule is driven through agent.rules.decide.decide exactly as the loop
drives it (runs until a verdict; the sequential rule re-runs the incumbent every
`incumbent_every` proposals). Printed per rule and σ: null-keep rate, false-discovery rate,
share of ≥ 3σ true gains kept, runs per proposal, true gain of the final best, and the bias of
the recorded best (recorded − true, in σ).

    .venv/bin/python benchmarks/keep_rule.py                 # 2,000 sweeps per rule and σ
    .venv/bin/python benchmarks/keep_rule.py --sweeps 200    # quicker
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.core.domain import ExperimentStatus  # noqa: E402
from agent.rules.decide import Evidence, Rule, Sample, decide, incumbent_due  # noqa: E402
from agent.rules.noise import squares  # noqa: E402

PROPOSALS = 100
TARGETS = {"null_keep": 0.03, "fdr": 0.20, "big_kept": 0.95, "runs": 1.5, "bias": 0.5}


@dataclass
class Tally:
    nulls: int = 0
    null_keeps: int = 0
    keeps: int = 0
    false_keeps: int = 0
    big: int = 0
    big_keeps: int = 0
    runs: int = 0
    proposals: int = 0
    gains: list[float] = field(default_factory=list)
    biases: list[float] = field(default_factory=list)


def _effect(rng: random.Random) -> float:
    """True change of the metric (minimised): negative = better."""
    u = rng.random()
    if u < 0.7:
        return 0.0
    size = rng.uniform(0.5, 4.0)
    return size if u < 0.9 else -size


class Night:
    """One simulated sweep for one rule: commits' true values and their measured runs."""

    def __init__(self, rule: Rule, sigma: float, rng: random.Random) -> None:
        self.rule, self.sigma, self.rng = rule, sigma, rng
        self.head_truth = 0.0
        self.head_runs: list[float] = []
        self.others = (0.0, 0)  # squares() of retired commits
        self.runs = 0

    def measure(self, truth: float) -> float:
        self.runs += 1
        return truth + self.rng.gauss(0.0, self.sigma)

    def settle(self, truth: float, baseline: bool) -> tuple[bool, list[float]]:
        """Run one commit until decide() gives a verdict; (kept, its measured values)."""
        values: list[float] = []
        best = tuple(Sample(v) for v in self.head_runs)
        while True:
            values.append(self.measure(truth))
            ev = Evidence(baseline, tuple(Sample(v) for v in values), best, self.others)
            verdict = decide(ev, self.rule)
            if verdict.status is not None:
                return verdict.status is ExperimentStatus.KEPT, values

    def run(self, tally: Tally) -> None:
        _, self.head_runs = self.settle(0.0, baseline=True)
        incumbent_runs = 0
        for k in range(PROPOSALS):
            if incumbent_due(k, incumbent_runs, self.rule):
                self.head_runs.append(self.measure(self.head_truth))
                incumbent_runs += 1
            self.propose(tally)
        tally.gains.append(-self.head_truth / self.sigma)
        recorded = statistics.fmean(self.head_runs)
        tally.biases.append((recorded - self.head_truth) / self.sigma)
        tally.runs += self.runs
        tally.proposals += PROPOSALS

    def propose(self, tally: Tally) -> None:
        effect = _effect(self.rng)
        truth = self.head_truth + effect
        kept, values = self.settle(truth, baseline=False)
        big = -effect >= 3 * self.sigma
        tally.nulls += effect == 0
        tally.big += big
        if kept:
            tally.keeps += 1
            tally.null_keeps += effect == 0
            tally.false_keeps += effect >= 0
            tally.big_keeps += big
            self.others = _add(self.others, self.head_runs)
            self.head_truth, self.head_runs = truth, values
        else:
            self.others = _add(self.others, values)


def _add(prior: tuple[float, int], values: list[float]) -> tuple[float, int]:
    ss, df = squares([values])
    return prior[0] + ss, prior[1] + df


def simulate(rule: Rule, sigma: float, sweeps: int, seed: int) -> Tally:
    rng = random.Random(seed)
    tally = Tally()
    for _ in range(sweeps):
        Night(rule, sigma, rng).run(tally)
    return tally


def rules(sigma: float) -> dict[str, Rule]:
    return {
        "strict": Rule(decision="strict"),
        "min_delta 1σ": Rule(decision="strict", min_delta=sigma),
        "sequential": Rule(),
    }


def row(name: str, sigma: float, t: Tally) -> dict[str, float | str]:
    return {
        "rule": name,
        "σ": sigma,
        "null_keep": t.null_keeps / max(t.nulls, 1),
        "fdr": t.false_keeps / max(t.keeps, 1),
        "big_kept": t.big_keeps / t.big if t.big else float("nan"),  # none ≥ 3σ at large σ
        "runs": t.runs / t.proposals,
        "gain": statistics.fmean(t.gains),
        "bias": statistics.fmean(t.biases),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=2000, help="sweeps per rule and σ")
    ap.add_argument("--sigmas", default="0.5,1,2", help="noise σ in effect units")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    t0 = time.perf_counter()
    print(f"{args.sweeps} sweeps × {PROPOSALS} proposals per rule and σ (70 % null, 20 % "
          "harmful, 10 % helpful; effects U(0.5, 4) units)")
    print(f"{'rule':<14}{'σ':>5}{'null keeps':>12}{'FDR':>8}{'≥3σ kept':>10}{'runs/prop':>11}"
          f"{'true gain':>11}{'bias (σ)':>10}")
    failures = []
    for sigma in (float(s) for s in args.sigmas.split(",")):
        for name, rule in rules(sigma).items():
            r = row(name, sigma, simulate(rule, sigma, args.sweeps, args.seed))
            big = float(r["big_kept"])
            big_text = "–" if big != big else f"{big:.1%}"
            print(f"{name:<14}{sigma:>5g}{r['null_keep']:>12.1%}{r['fdr']:>8.1%}"
                  f"{big_text:>10}{r['runs']:>11.2f}{r['gain']:>11.2f}"
                  f"{r['bias']:>10.2f}")
            if name == "sequential" and sigma == 1.0:
                failures = _check(r)
    print(f"(true gain: final best's true improvement over the baseline, in σ; "
          f"{time.perf_counter() - t0:.0f} s)")
    if failures:
        print("default rule misses its targets at σ = 1: " + "; ".join(failures))
        return 1
    print("default rule at σ = 1 meets its targets")
    return 0


def _check(r: dict[str, float | str]) -> list[str]:
    got = {k: float(r[k]) for k in TARGETS}
    bad = []
    if got["null_keep"] > TARGETS["null_keep"]:
        bad.append(f"null keeps {got['null_keep']:.1%} > 3 %")
    if got["fdr"] > TARGETS["fdr"]:
        bad.append(f"FDR {got['fdr']:.1%} > 20 %")
    if got["big_kept"] < TARGETS["big_kept"]:
        bad.append(f"≥3σ gains kept {got['big_kept']:.1%} < 95 %")
    if got["runs"] > TARGETS["runs"]:
        bad.append(f"runs/proposal {got['runs']:.2f} > 1.5")
    if abs(got["bias"]) > TARGETS["bias"]:
        bad.append(f"|bias| {abs(got['bias']):.2f}σ > 0.5σ")
    return bad


if __name__ == "__main__":
    raise SystemExit(main())
