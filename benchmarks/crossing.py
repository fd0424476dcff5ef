"""Which kinds of change cross late on a real script: the early stop's model, measured.

The early stop (docs/keep-rule.md#the-early-stop) assumes a change no worse at the end is, in
expectation, no worse at a check. Curves that cross late break it, so their categories are
exempt (data/schedule and optimizer by default). This benchmark measures, on the reference
target (experiments/gpt, its real train.py on this machine's device), which single-knob changes
are behind at 25 / 50 / 75 % of the budget yet better at the end, and what the rule's check
does with each run.

Each change and the baseline train for `--steps` optimizer steps (a compute budget, so the
machine's load moves no loss) with seeds 1..N. A run's curve is its progress lines at
fraction = step / steps; at each check the rule's own `agent.rules.prune.check` judges it
against the baseline's runs (the incumbent) at the level the keep rule sets
(`agent.rules.decide.stop_level`), the category as the engine classifies the knob.

Usage:
    .venv/bin/python benchmarks/crossing.py --steps 96 --seeds 3 --baseline-seeds 5
    .venv/bin/python benchmarks/crossing.py --load results.json   # re-read a saved night

The change list is fixed before any run (below); nothing here is tuned on its results.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.core.prune_policy import PrunePolicy  # noqa: E402
from agent.proposers.knobs import knob_proposal  # noqa: E402
from agent.rules.categories import category_of_knob  # noqa: E402
from agent.rules.decide import Rule, stop_level  # noqa: E402
from agent.rules.prune import check, matched  # noqa: E402
from benchmarks.demo_changes import TARGET as GPT  # noqa: E402
from benchmarks.demo_changes import copy_with  # noqa: E402
from benchmarks.gpt_cpu import parse_summary  # noqa: E402
from runner.summary import parse_progress  # noqa: E402

# (knob, new value): learning rates both ways, regularisers, architecture, and two controls the
# default exempts (a schedule and an optimizer change). Chosen before the first run.
CHANGES = [
    ("LR", "1.5e-3"), ("LR", "6e-3"), ("LR", "1.2e-2"),
    ("EMBED_LR", "0.05"), ("EMBED_LR", "0.2"),
    ("WEIGHT_DECAY", "0.0"), ("WEIGHT_DECAY", "0.3"), ("GRAD_CLIP", "0.0"),
    ("DEPTH", "2"), ("DEPTH", "6"), ("D_MODEL", "192"), ("SOFTCAP", "0.0"),
    ("USE_SWIGLU", "True"),
    ("WARMDOWN_FRAC", "0.5"), ("USE_MUON", "True"),
]
BASELINE = ("baseline", "")


@dataclass(frozen=True)
class RunOut:
    knob: str
    value: str
    seed: int
    metric: float | None
    curve: list[tuple[float, float]]


def check_changes(changes: list[tuple[str, str]]) -> None:
    """Each change as the knobs search would make it (agent.proposers.knobs.knob_proposal): an
    unknown knob, or a value that changes nothing, is named before any run."""
    files = {"train.py": (GPT / "train.py").read_text()}
    for change in changes:
        try:
            knob_proposal(files, (change,))
        except ValueError as e:
            raise SystemExit(f"--changes: {e}") from None


def run_one(work: Path, knob: str, value: str, seed: int, steps: int, threads: int) -> RunOut:
    change = None if knob == "baseline" else (knob, value)
    dest = copy_with(work, f"{knob}-{value}-{seed}", change)
    env = dict(os.environ, OVERNIGHT_BUDGET_STEPS=str(steps), OVERNIGHT_SEED=str(seed),
               OMP_NUM_THREADS=str(threads), OVERNIGHT_DEVICE="cpu")
    proc = subprocess.run([sys.executable, "train.py"], cwd=dest, env=env, text=True,
                          capture_output=True, timeout=3600)
    curve = []
    for line in proc.stdout.splitlines():
        point = parse_progress(line)
        if point is not None:
            curve.append((point.step / steps, point.loss))
    bpb = parse_summary(proc.stdout).get("val_bpb")
    metric = float(bpb) if bpb is not None and proc.returncode == 0 else None
    shutil.rmtree(dest, ignore_errors=True)
    print(f"  {knob} {value} seed {seed}: {metric} ({len(curve)} lines)", flush=True)
    return RunOut(knob, value, seed, metric, curve)


def collect(steps: int, seeds: range, baseline_seeds: range, jobs: int, threads: int,
            changes: list[tuple[str, str]]) -> dict:
    check_changes(changes)
    plan = [(*BASELINE, s) for s in baseline_seeds]
    plan += [(k, v, s) for k, v in changes for s in seeds]
    with tempfile.TemporaryDirectory(prefix="overnight-crossing-") as tmp:
        with ThreadPoolExecutor(jobs) as pool:
            outs = list(pool.map(lambda p: run_one(Path(tmp), *p, steps, threads), plan))
    return {"steps": steps, "load": os.getloadavg()[0],
            "runs": [o.__dict__ for o in outs]}


def paired(mine: list[RunOut], base: list[RunOut]) -> tuple[float, float, int]:
    """(mean of the change's metric minus the same seed's baseline, its standard error, pairs):
    the pair shares data order and, where the shapes agree, the initialisation."""
    by_seed = {b.seed: b.metric for b in base}
    diffs = [r.metric - by_seed[r.seed] for r in mine
             if r.metric is not None and r.seed in by_seed]
    if not diffs:
        return math.nan, math.nan, 0
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    return statistics.fmean(diffs), se, len(diffs)


def analyse(data: dict, max_runs: int = 4) -> list[dict]:
    runs = [RunOut(**{**r, "curve": [tuple(p) for p in r["curve"]]}) for r in data["runs"]]
    base = [r for r in runs if r.knob == "baseline" and r.metric is not None]
    base_metric = [r.metric for r in base]
    sd = statistics.stdev(base_metric)
    policy = PrunePolicy()
    level = stop_level(Rule(max_runs=max_runs))
    rows = []
    changes = list(dict.fromkeys((r.knob, r.value) for r in runs if r.knob != "baseline"))
    for knob, value in changes:
        mine = [r for r in runs if (r.knob, r.value) == (knob, value)]
        category = category_of_knob(knob).value
        gaps: list[list[float]] = [[] for _ in policy.checks]
        stops: list[str] = []
        behind = [0] * len(policy.checks)
        for r in mine:
            stopped_at = None
            for i, _ in enumerate(policy.checks):
                m = matched(r.curve, [b.curve for b in base], policy.part(i))
                if m.loss is not None and len(m.incumbents) > 1:
                    gaps[i].append((m.loss - statistics.fmean(m.incumbents))
                                   / statistics.stdev(m.incumbents))
                # the rule's check with the category not exempt: what it would do if judged
                call = check(r.curve, [b.curve for b in base], i, level, policy)
                if call.p_worse is not None and call.p_worse <= 0.05:
                    behind[i] += 1
                if call.stop and stopped_at is None:
                    stopped_at = round(policy.checks[i] * 100)
            stops.append("–" if stopped_at is None else f"{stopped_at} %")
        diff, se, pairs = paired(mine, base)
        if pairs < 2 or not diff:
            t = math.nan
        else:
            t = diff / se if se > 0 else math.copysign(math.inf, diff)
        better = pairs > 1 and t < -2
        stopped_any = any(s != "–" for s in stops)
        rows.append({
            "change": f"{knob} {value}", "category": category,
            "exempt": category in policy.exempt,
            "final": diff, "final_sd": diff / sd, "final_t": t, "better": better,
            "gaps": [statistics.fmean(g) if g else None for g in gaps],
            "behind": behind, "n": len(mine), "stops": stops,
            "crosses": better and any(behind),
            "not_worse_stopped": (sum(s != "–" for s in stops)
                                  if pairs > 1 and t < 2 else 0),
            "winner_stopped": better and stopped_any,
        })
    return rows


def report(data: dict, rows: list[dict]) -> None:
    policy = PrunePolicy()
    base = [r["metric"] for r in data["runs"] if r["knob"] == "baseline" and r["metric"]]
    print(f"\n{data['steps']} steps; baseline val_bpb {statistics.fmean(base):.4f} ± sd "
          f"{statistics.stdev(base):.4f} ({len(base)} seeds); load {data['load']:.1f}")
    checks = " | ".join(f"gap at {round(c * 100)} % (sd)" for c in policy.checks)
    print(f"| change | category | final val_bpb − the same seed's baseline (in baseline sd; t) | "
          f"{checks} | runs behind at each check (P ≤ 0.05) | the rule, if judged (each seed) | "
          "exempt by default |")
    print("|" + " --- |" * (7 + len(policy.checks) - 1))
    for r in rows:
        gaps = " | ".join("–" if g is None else f"{g:+.1f}" for g in r["gaps"])
        flag = " **crosses late**" if r["crosses"] else (" better" if r["better"] else "")
        print(f"| {r['change']} | {r['category']} | {r['final']:+.3f} ({r['final_sd']:+.1f} sd; "
              f"t {r['final_t']:+.1f})"
              f"{flag} | {gaps} | {'/'.join(map(str, r['behind']))} of {r['n']} | "
              f"{', '.join(r['stops'])} | {'yes' if r['exempt'] else 'no'} |")
    winners = [r for r in rows if r["better"]]
    crossing = [r for r in winners if r["crosses"]]
    stopped = [r for r in winners if r["winner_stopped"]]
    level = [r for r in rows if r["not_worse_stopped"]]
    print(f"\nbetter at the end (t < −2): {len(winners)}; behind at a check first: "
          f"{len(crossing)} ({', '.join(r['change'] for r in crossing) or 'none'}); "
          f"a run of one stopped by the rule if judged: {len(stopped)} "
          f"({', '.join(r['change'] + ' [' + r['category'] + ']' for r in stopped) or 'none'})")
    named = ", ".join(f"{r['change']}: {r['not_worse_stopped']} of {r['n']}" for r in level)
    print("runs stopped though their change was not worse at the end (paired t < 2): "
          f"{sum(r['not_worse_stopped'] for r in level)} ({named or 'none'})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--baseline-seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=1, help="seeds first-seed, first-seed + 1…")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads a run")
    ap.add_argument("--changes", help="KNOB=VALUE,... instead of the fixed list")
    ap.add_argument("--save", type=Path, help="write the runs' curves and metrics here")
    ap.add_argument("--load", type=Path, action="append",
                    help="analyse saved runs instead (repeat it to pool nights of one budget)")
    args = ap.parse_args()
    if args.load:
        nights = [json.loads(p.read_text()) for p in args.load]
        if len({n["steps"] for n in nights}) != 1:
            raise SystemExit("--load: the nights have different budgets of steps")
        data = {"steps": nights[0]["steps"], "load": max(n["load"] for n in nights),
                "runs": [r for n in nights for r in n["runs"]]}
    else:
        changes = CHANGES if not args.changes else [
            tuple(c.split("=", 1)) for c in args.changes.split(",")]
        if any(len(c) != 2 for c in changes):
            raise SystemExit(f"--changes: KNOB=VALUE,... expected, got {args.changes!r}")
        first = args.first_seed
        data = collect(args.steps, range(first, first + args.seeds),
                       range(first, first + args.baseline_seeds), args.jobs, args.threads,
                       changes)
        if args.save:
            args.save.write_text(json.dumps(data))
    report(data, analyse(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
