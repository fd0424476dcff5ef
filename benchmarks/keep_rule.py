"""Monte Carlo of a 100-proposal night: how often each keep rule keeps noise, via the real decide().

Each sweep: a baseline, then proposals whose true effect on the head is 0 (70 %), harmful
(20 %: worse by U(0.5, 4) effect units) or helpful (10 %: better by U(0.5, 4)). Stationary
worlds measure truth + N(0, σ); shifting worlds add a machine whose load changes in phases
of several proposals, moving the metric by 2–5σ and the throughput with it (see
benchmarks/keep_world.py), with the throughput from the summary block, from progress lines
only, or not reported at all. Each rule is driven through agent.rules.decide.decide exactly as the
loop drives it. Printed per world and rule: null-keep rate, false-discovery rate (the mean over
nights of false keeps / max(keeps, 1)), share of ≥ 3σ true gains kept, runs per proposal
(incumbent runs beside a change per proposal), true gain of the final best, and the bias of
the recorded best (recorded − true, in σ).

    .venv/bin/python benchmarks/keep_rule.py                 # 2,000 sweeps per row
    .venv/bin/python benchmarks/keep_rule.py --sweeps 200    # quicker
    .venv/bin/python benchmarks/keep_rule.py --heldout       # the worlds nobody tuned against
    .venv/bin/python benchmarks/keep_rule.py --night budget  # a fixed-budget night on curves
    .venv/bin/python benchmarks/keep_rule.py --pace          # the rule beside a peer, PACE

`--heldout`: heavy-tailed noise, loss spikes, changes that change the noise, a slow drift the
throughput does not show, a night of rare small gains, another mix of changes, rare gains
with heavy tails on a shifting machine, and a graded load (busy spells of 0.5–5σ whose speed
moves only 3 % a σ, so the mild ones hide in the speed's noise); the targets there are FDR
≤ 20 % and null keeps ≤ 3 %.

`--night budget` (benchmarks/curve_world.py): every rule gets the same GPU-seconds (100 full
runs); a run stopped early (agent.rules.prune) costs the share it trained.

`--pace` (with any of the above): the default rule beside PACE, a paired e-process commit gate
(benchmarks/pace_gate.py), each on the same changes in the same order (paired nights).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from keep_world import PROPOSALS, Tally, World, simulate  # noqa: E402

from agent.rules.decide import Rule  # noqa: E402

V = TypeVar("V")

STATIONARY = {"null_keep": 0.03, "fdr": 0.20, "big_kept": 0.95, "runs": 1.5, "bias": 0.5}
SHIFTING = {"null_keep": 0.03, "fdr": 0.20, "big_kept": 0.95, "runs": 1.7}


def rules(sigma: float) -> dict[str, Rule]:
    return {
        "strict": Rule(decision="strict"),
        "min_delta 1σ": Rule(decision="strict", min_delta=sigma),
        "sequential": Rule(),
    }


def worlds(sigmas: list[float]) -> list[tuple[World, dict[str, float] | None]]:
    """(world, the default rule's targets there) in the order printed."""
    out: list[tuple[World, dict[str, float] | None]] = [
        (World(f"stationary σ={s:g}", sigma=s, source=None), STATIONARY if s == 1 else None)
        for s in sigmas]
    out.append((World("stationary, throughput ±2 %"), STATIONARY))
    out += [
        (World("shifting, summary", shifting=True), SHIFTING),
        (World("shifting, progress lines", shifting=True, source="progress"), SHIFTING),
        (World("shifting, no throughput", shifting=True, source=None), None),
        (World("shifting half the night", shifting=True, busy_share=0.5), None),
    ]
    return out


def heldout() -> list[World]:
    """Worlds the rule was never tuned against (keep_world.World's held-out shapes), each
    with the targets FDR ≤ 20 % and null keeps ≤ 3 % (≥ 3σ kept reported)."""
    return [
        World("heavy tails (t3)", noise="t3"),
        World("loss spikes (3 % of runs)", noise="spikes"),
        World("changes change the noise", noise_spread=0.5),
        World("slow drift (0.15σ a run)", drift=0.15),
        World("rare small gains", mix="rare"),
        World("another mix of changes", mix="fresh"),
        World("rare gains, t3, shifting", noise="t3", mix="rare", shifting=True),
        World("graded load (0.5–5σ, 3 % speed a σ)", shifting=True, load=(0.5, 5.0),
              speed_per_sigma=0.03),
    ]


HELDOUT = {"null_keep": 0.03, "fdr": 0.20}


def tallies(world: World, sweeps: int, seed: int, pace: bool = False
            ) -> Iterator[tuple[str, Tally]]:
    """Each row's nights in a world: the rules, or with `pace` the default rule and PACE's
    variants (benchmarks/pace_gate.py) on the same changes (paired nights)."""
    if not pace:
        for name, rule in rules(world.sigma).items():
            yield name, simulate(rule, world, sweeps, seed)
        return
    from pace_gate import PEERS, simulate_pace

    yield "sequential", simulate(Rule(), world, sweeps, seed, paired=True)
    for name, gate in PEERS.items():
        yield name, simulate_pace(gate, world, sweeps, seed)


def row(t: Tally) -> dict[str, float]:
    return {
        "null_keep": t.null_keeps / max(t.nulls, 1),
        "fdr": t.fdr(),
        "pooled_fdr": t.false_keeps / max(t.keeps, 1),
        "big_kept": t.big_keeps / t.big if t.big else float("nan"),  # none ≥ 3σ at large σ
        "runs": t.runs / t.proposals,
        "beside": t.beside / t.proposals,
        "gain": statistics.fmean(t.gains),
        "bias": statistics.fmean(t.biases),
    }


def ablation(worlds: list[World], variants: Mapping[str, V], use: Callable[[V], None],
             sweeps: int, seed: int, label: str) -> None:
    """The default rule's row in each world under each variant, `use` putting it in place (the
    caller puts the default back): benchmarks/speed_guards.py, benchmarks/addis_params.py."""
    w, v = max(len(x.name) for x in worlds) + 2, max(len(n) for n in variants) + 2
    print(f"{sweeps} nights × {PROPOSALS} proposals a world and {label}")
    print(f"{'world':<{w}}{label:<{v}}{'null keeps':>11}{'FDR':>7}{'≥3σ kept':>10}"
          f"{'runs/prop':>10}{'true gain':>10}")
    for world in worlds:
        for name, variant in variants.items():
            use(variant)
            r = row(simulate(Rule(), world, sweeps, seed))
            kept = "–" if math.isnan(r["big_kept"]) else f"{r['big_kept']:.1%}"
            print(f"{world.name:<{w}}{name:<{v}}{r['null_keep']:>11.1%}{r['fdr']:>7.1%}"
                  f"{kept:>10}{r['runs']:>10.2f}{r['gain']:>10.2f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweeps", type=int, default=2000, help="sweeps per rule and world")
    ap.add_argument("--sigmas", default="0.5,1,2", help="stationary noise σ in effect units")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", default="", help="print only worlds whose name contains this")
    ap.add_argument("--night", choices=("proposals", "budget"), default="proposals",
                    help="100 proposals per night (default), or a fixed budget on curves")
    ap.add_argument("--heldout", action="store_true",
                    help="the worlds the rule was never tuned against (FDR and null keeps)")
    ap.add_argument("--ladder", action="store_true",
                    help="with --night budget: the promotion ladder's table instead (a spike)")
    ap.add_argument("--pace", action="store_true",
                    help="the default rule beside PACE (benchmarks/pace_gate.py), paired nights")
    args = ap.parse_args()
    if args.night == "budget":
        from budget_report import report_budget, report_ladder, report_pace

        if args.ladder:
            return report_ladder(args.sweeps, args.seed)
        if args.pace:
            return report_pace(args.sweeps, args.seed)
        return report_budget(args.sweeps, args.seed)
    if args.heldout:
        return held_out(args.sweeps, args.seed, args.only, args.pace)
    t0 = time.perf_counter()
    w = 24 if args.pace else 14
    print(f"{args.sweeps} sweeps × {PROPOSALS} proposals per rule and world (70 % null, 20 % "
          "harmful, 10 % helpful; effects U(0.5, 4) units)" + (", paired" if args.pace else ""))
    print(f"{'world':<30}{'rule':<{w}}{'null keeps':>11}{'FDR':>7}{'≥3σ kept':>10}"
          f"{'runs/prop':>10}{'(beside)':>9}{'true gain':>10}{'bias (σ)':>9}")
    failures = []
    for world, targets in worlds([float(s) for s in args.sigmas.split(",")]):
        if args.only not in world.name:
            continue
        for name, tally in tallies(world, args.sweeps, args.seed, args.pace):
            r = row(tally)
            big = "–" if r["big_kept"] != r["big_kept"] else f"{r['big_kept']:.1%}"
            print(f"{world.name:<30}{name:<{w}}{r['null_keep']:>11.1%}{r['fdr']:>7.1%}"
                  f"{big:>10}{r['runs']:>10.2f}{r['beside']:>9.2f}{r['gain']:>10.2f}"
                  f"{r['bias']:>9.2f}", flush=True)
            if name == "sequential" and targets is not None:
                failures += [f"{world.name}: {m}" for m in _check(r, targets)]
    print(f"(true gain: final best's true improvement over the baseline, in σ; "
          f"{time.perf_counter() - t0:.0f} s)")
    if failures:
        print("the default rule misses its targets: " + "; ".join(failures))
        return 1
    print("the default rule meets its targets in every world that has them")
    return 0


def held_out(sweeps: int, seed: int, only: str, pace: bool = False) -> int:
    """The default rule in the held-out worlds: FDR ≤ 20 % and null keeps ≤ 3 % in each; with
    `pace`, PACE's rows beside it (paired nights)."""
    t0 = time.perf_counter()
    w, wn = (24 if pace else 0), max(len(x.name) for x in heldout()) + 2
    print(f"{sweeps} sweeps × {PROPOSALS} proposals per held-out world (FDR: the mean over "
          "nights of false keeps / max(keeps, 1); pooled: all false keeps / all keeps)")
    print(f"{'world':<{wn}}{'rule' if pace else '':<{w}}{'null keeps':>11}{'FDR':>7}{'pooled':>8}"
          f"{'≥3σ kept':>10}{'runs/prop':>10}{'keeps':>7}{'true gain':>10}")
    failures = []
    for world in heldout():
        if only not in world.name:
            continue
        rows = tallies(world, sweeps, seed, pace) if pace else iter(
            [("sequential", simulate(Rule(), world, sweeps, seed))])
        for name, t in rows:
            r = row(t)
            big = "–" if r["big_kept"] != r["big_kept"] else f"{r['big_kept']:.1%}"
            print(f"{world.name:<{wn}}{name if pace else '':<{w}}{r['null_keep']:>11.1%}"
                  f"{r['fdr']:>7.1%}{r['pooled_fdr']:>8.1%}{big:>10}{r['runs']:>10.2f}"
                  f"{t.keeps / sweeps:>7.1f}{r['gain']:>10.2f}", flush=True)
            if name == "sequential":
                failures += [f"{world.name}: {m}" for m in _check(r, HELDOUT)]
    print(f"({time.perf_counter() - t0:.0f} s)")
    if failures:
        print("the default rule misses its targets: " + "; ".join(failures))
        return 1
    print("the default rule meets FDR ≤ 20 % and null keeps ≤ 3 % in every held-out world")
    return 0


def _check(r: dict[str, float], targets: dict[str, float]) -> list[str]:
    bad = []
    if r["null_keep"] > targets["null_keep"]:
        bad.append(f"null keeps {r['null_keep']:.1%} > {targets['null_keep']:.0%}")
    if r["fdr"] > targets["fdr"]:
        bad.append(f"FDR {r['fdr']:.1%} > {targets['fdr']:.0%}")
    if "big_kept" in targets and r["big_kept"] < targets["big_kept"]:
        bad.append(f"≥3σ gains kept {r['big_kept']:.1%} < {targets['big_kept']:.0%}")
    if "runs" in targets and r["runs"] > targets["runs"]:
        bad.append(f"runs/proposal {r['runs']:.2f} > {targets['runs']}")
    if "bias" in targets and abs(r["bias"]) > targets["bias"]:
        bad.append(f"|bias| {abs(r['bias']):.2f}σ > {targets['bias']}σ")
    return bad


if __name__ == "__main__":
    raise SystemExit(main())
