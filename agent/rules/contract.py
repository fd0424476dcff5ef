"""Does a target honour the script contract? Pure checks over what a run printed, with fixes.

The contract: read OVERNIGHT_BUDGET_S and train that long, print progress lines, end with a
`---` block holding the metric and `training_seconds`, and compute the metric outside the files
a proposal may change; seed the run from OVERNIGHT_SEED (else its repeats say nothing of the
noise) and show its speed (else the machine's load cannot be checked); print a loss often enough
for the early stop. Used by `overnight doctor` (two runs) and `overnight run` (its baseline).
Pure: the stdlib, agent.core.config, the prune policy and agent.rules' Sample and throughput.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from agent.core.bounds import Bound, number_text
from agent.core.budget import ComputeBudget
from agent.core.config import CONFIG_FILE, TargetConfig
from agent.core.prune_policy import PrunePolicy
from agent.rules.placement import Sample

NONE_HINT = (
    "the machine's load cannot be checked: the summary has no num_steps or total_tokens_M "
    "(with training_seconds) and no progress line shows a step with an elapsed time"
)
NONE_FIX = (
    "print `num_steps: <steps>` in the summary block, or progress lines such as "
    "`step 120 | loss 3.41 | elapsed 31.2s`"
)


Status = Literal["ok", "warn", "fail", "info"]
BUDGET_SLACK = 1.25  # doctor fails a run past this factor (+1 s) that one step does not explain
BUDGET_OVERSHOOT = 0.05  # past this share over the budget a run is warned (doctor and the loop)
BUDGET_UNDERSHOOT = 0.5  # a script that stops before this share of the budget ignores it
MAX_OVERHEAD_SHARE = 0.5
NOISE_MARGIN = 2.0  # suggested min_delta = this many run-to-run sigmas


@dataclass(frozen=True)
class RunFacts:
    """What one run of the unmodified target showed."""

    timed_out: bool
    exit_code: int | None
    wall_s: float
    summary: Mapping[str, float | str]
    progress_points: int
    error: str | None = None
    after_summary_s: float | None = None  # from the summary block's `---` to the exit


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""
    folded: tuple[str, ...] = ()  # knock-on effects of this failure, shown under it


SUMMARY_FIX = (
    "end the script with a line `---` then `key: value` lines, at least `{metric}: <value>` and "
    "`training_seconds: <seconds>` (see docs/target.md, 'The script contract')"
)
BUDGET_FIX = (
    "read the budget: `budget = float(os.environ['OVERNIGHT_BUDGET_S'])` and stop training "
    "once that many seconds of training have passed, then evaluate and print the `---` block"
)


def _number(summary: Mapping[str, float | str], key: str) -> float | None:
    value = summary.get(key)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def check_summary(config: TargetConfig, run: RunFacts) -> list[Check]:
    """The `---` block and the metric in it."""
    fix = SUMMARY_FIX.format(metric=config.metric)
    if not run.summary:
        why = "the run timed out before printing one" if run.timed_out else "none in the log"
        return [Check("summary block", "fail", why, fix)]
    checks = [Check("summary block", "ok", f"{len(run.summary)} keys")]
    metric = _number(run.summary, config.metric)
    if metric is None:
        found = ", ".join(sorted(run.summary))
        checks.append(Check("metric", "fail", f"no finite {config.metric!r} in the block "
                            f"(found {found})", fix))
    else:
        checks.append(Check("metric", "ok", f"{config.metric} = {metric:g}"))
    return checks


def check_budget(config: TargetConfig, run: RunFacts) -> Check:
    """training_seconds against OVERNIGHT_BUDGET_S (num_steps or total_tokens_M against a
    compute budget); a timeout says the budget was ignored."""
    budget = config.budget_s
    if run.timed_out:
        return Check("budget honoured", "fail", f"killed at the {config.timeout_s:g} s timeout "
                     f"with a {config.budget_text} budget", BUDGET_FIX)
    if config.budget is not None:
        off = compute_off(run.summary, config.budget)
        return Check("budget honoured", "fail" if off else "ok",
                     off or f"trained {config.budget}", "" if not off else
                     f"train exactly {config.budget.env_name}'s amount, and print it")
    trained = _number(run.summary, "training_seconds")
    if trained is None:
        return Check("budget honoured", "fail", "no training_seconds in the summary block",
                     BUDGET_FIX)
    late = overrun(trained, budget, run.summary)
    if late is not None:
        one_step = _last_step(trained, budget, run.summary) is not None
        ignored = not one_step and trained > budget * BUDGET_SLACK + 1.0
        return Check("budget honoured", "fail" if ignored else "warn", late,
                     "raise budget_s so that a run trains many steps" if one_step else BUDGET_FIX)
    short = underrun(trained, budget)
    if short is not None:
        return Check("budget honoured", "warn", short, BUDGET_FIX)
    return Check("budget honoured", "ok", f"trained {trained:g} s of {budget:g} s")


def _last_step(trained: float, budget: float, summary: Mapping[str, float | str]
               ) -> float | None:
    """A run's seconds a step (from the summary's num_steps) when its overrun is within its
    last step: the loop reads the clock between steps. None without num_steps or when the
    overrun is longer than a step."""
    steps = _number(summary, "num_steps")
    step = trained / steps if steps is not None and steps >= 1 else None
    return step if step is not None and trained - budget <= step else None


def overrun(trained: float, budget: float, summary: Mapping[str, float | str]) -> str | None:
    """The one sentence that doctor and the loop both say of a run that trained more than
    BUDGET_OVERSHOOT past its budget; None when it did not."""
    if trained <= budget * (1 + BUDGET_OVERSHOOT):
        return None
    head = f"trained {trained:g} s for a {budget:g} s budget ({trained / budget - 1:.0%} over)"
    step = _last_step(trained, budget, summary)
    if step is not None:
        return (f"{head}: its last step ran past it ({step:.3g} s a step, and the loop reads "
                f"the clock between steps), so runs train a whole number of steps and one more "
                f"or less is {step / budget:.0%} of the budget")
    return f"{head}: runs are not comparable; does the script stop at OVERNIGHT_BUDGET_S?"


def underrun(trained: float, budget: float) -> str | None:
    """What doctor and the loop both say of a run that stopped before BUDGET_UNDERSHOOT of its
    budget; None when it did not."""
    if trained >= budget * BUDGET_UNDERSHOOT:
        return None
    return (f"trained only {trained:g} s of a {budget:g} s budget: something ends training "
            "first, a step or epoch cap or a loop that does not read OVERNIGHT_BUDGET_S")


def check_progress(config: TargetConfig, run: RunFacts) -> Check:
    if run.progress_points:
        return Check("progress lines", "ok", f"{run.progress_points} parsed (the loss curve)")
    how = ("your progress_regex matched no line" if config.progress_regex
           else "no line such as `step 120 | loss 3.41 | elapsed 31.2s`")
    return Check("progress lines", "warn", how,
                 "print `step N | loss X | elapsed Ts`, or set progress_regex in "
                 f"{CONFIG_FILE} with named groups, e.g. "
                 r"'(?P<step>\d+)/\s*\d+ batches.*loss\s+(?P<loss>[\d.]+)'")


AFTER_SUMMARY_FIX = (
    "a run ends when the script exits, and nothing after the summary block is read: skip that "
    "work (sampling, saving, plotting) under overnight, e.g. `if 'OVERNIGHT_BUDGET_S' in "
    "os.environ: raise SystemExit` right after the block")


def check_overhead(run: RunFacts) -> Check:
    trained = _number(run.summary, "training_seconds")
    if trained is None or run.wall_s <= 0:
        return Check("start-up overhead", "info", "unknown (no training_seconds)")
    share = max(0.0, 1.0 - trained / run.wall_s)
    detail = f"{share:.0%} of {run.wall_s:.1f} s wall time is not training"
    after = run.after_summary_s
    if after is not None and after >= 1.0:
        detail += f", {after:.1f} s of it after the summary block"
    if share > MAX_OVERHEAD_SHARE:
        if after is not None and after > (run.wall_s - trained) / 2:
            return Check("start-up overhead", "warn", detail, AFTER_SUMMARY_FIX)
        return Check("start-up overhead", "warn", detail,
                     "raise budget_s so that training dominates each run")
    return Check("start-up overhead", "ok", detail)


def check_run(config: TargetConfig, run: RunFacts) -> list[Check]:
    """The cheap checks one finished run answers (what `overnight run` reports on its baseline)."""
    later = [*check_summary(config, run), check_budget(config, run)]
    error = run.error or (f"exit code {run.exit_code}" if run.exit_code not in (0, None)
                          and not run.timed_out else None)
    if error and not run.summary and "summary block" not in error:
        # No block because the run failed: what that failure makes fail too is folded under it.
        knock_on = tuple(f"so: {c.name}: {c.detail}" for c in later if c.status == "fail")
        return [Check("runs", "fail", f"the run failed: {error}",
                      "run the command by hand in a clean clone and fix the error",
                      folded=knock_on), check_progress(config, run)]
    if run.timed_out:
        budget = next(c for c in later if c.name == "budget honoured")
        knock_on = tuple(f"so: {c.name}: {c.detail}" for c in later
                         if c.status == "fail" and c is not budget)
        later = [Check(budget.name, budget.status, budget.detail, budget.fix, knock_on)]
    return [*later, check_progress(config, run), check_overhead(run)]


def check_noise(config: TargetConfig, first: float | None, second: float | None) -> list[Check]:
    """Two runs with seeds seed and seed + 1 (as a sweep's baseline runs): the seed-to-seed
    sigma and the min_delta it implies (agent.rules.repeats says whether the seed is used)."""
    if first is None or second is None:
        return [Check("noise", "info", "needs two runs that print the metric")]
    sigma = abs(first - second) / math.sqrt(2.0)
    suggested = NOISE_MARGIN * sigma
    checks: list[Check] = []
    if sigma == 0:
        checks.append(Check("noise", "info", "not measured: the two runs printed the same "
                            f"{config.metric}, so each change runs once and is kept when better by "
                            "more than min_delta"))
    elif config.decision == "sequential":  # the keep rule measures σ̂ as the sweep goes
        checks.append(Check("noise", "ok", f"seed-to-seed sigma ~ {sigma:.4g} (2 runs); the "
                            "sequential keep rule measures it as the sweep goes"))
    elif config.min_delta >= suggested:
        checks.append(Check("noise", "ok", f"sigma ~ {sigma:.4g}; min_delta {config.min_delta:g}"))
    else:
        checks.append(Check("noise", "warn", f"run-to-run sigma ~ {sigma:.4g} (2 runs) but "
                            f"min_delta = {config.min_delta:g}: keeps within the noise are luck",
                            f"set min_delta = {suggested:.3g} in {CONFIG_FILE} (or confirm_runs)"))
    return checks


_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", re.MULTILINE)


def check_evaluation(config: TargetConfig, files: Mapping[str, str]) -> Check:
    """Is the metric computed in a protected module that the editable script imports?"""
    protected_modules = {p[:-3].replace("/", ".") for p in config.protected if p.endswith(".py")}
    imported = {m for text in files.values() for pair in _IMPORT.findall(text) for m in pair if m}
    imported |= {m.split(".")[0] for m in imported}
    used = sorted(protected_modules & imported)
    if used:
        return Check("metric safe from proposals", "ok",
                     f"the evaluation can live in protected {', '.join(used)}, which the "
                     "editable code imports")
    return Check("metric safe from proposals", "warn",
                 "the editable files import no protected module, so the code that computes "
                 f"{config.metric} is itself editable: a proposal may change how it is measured",
                 "move the evaluation (and the data loading) into a file listed in protected, "
                 "e.g. prepare.py, and import it from the script")


def compute_off(summary: Mapping[str, float | str], budget: ComputeBudget) -> str | None:
    """What a run that did not train its compute budget says (None: it did, or its summary
    does not say): num_steps against steps, total_tokens_M against tokens (within a step)."""
    steps, tokens_m = _number(summary, "num_steps"), _number(summary, "total_tokens_M")
    if budget.unit == "steps" and steps is not None and steps != budget.amount:
        done = f"{steps:g} steps"
    elif budget.unit == "tokens" and tokens_m is not None and abs(
            tokens_m * 1e6 - budget.amount) > max(tokens_m * 1e6 / max(steps or 1, 1), 1e3):
        done = f"{tokens_m * 1e6:,.0f} tokens"
    else:
        return None
    return (f"trained {done} of a {budget} budget: runs are not comparable; does the script "
            f"read {budget.env_name}?")


def contract_warnings(summary: Mapping[str, float | str], budget_s: float,
                      compute: ComputeBudget | None = None) -> list[str]:
    """Problems with one run's summary that make runs incomparable (none: an empty list)."""
    if compute is not None:
        off = compute_off(summary, compute)
        return [off] if off else []
    seconds = summary.get("training_seconds")
    if not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return ["the summary has no training_seconds: the budget cannot be checked"] \
            if summary else []
    said = overrun(float(seconds), budget_s, summary) or underrun(float(seconds), budget_s)
    return [said] if said else []


# --- repeats: the seed and the speed ---------------------------------------------------
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
            f"nothing about the noise: each change runs once and is kept when better by more "
            f"than min_delta. "
            f"Fix: {SEED_FIX}")


def load_unchecked(runs: Sequence[Sample]) -> str | None:
    """The warning when no run knows its speed (None when one does)."""
    if not runs or any(r.throughput is not None for r in runs):
        return None
    return f"{NONE_HINT}. Fix: {NONE_FIX}"


def baseline_warnings(runs: Sequence[Sample], metric: str,
                      bounds: Sequence[Bound] = ()) -> tuple[str, ...]:
    return tuple(w for w in (seed_ignored(runs, metric), load_unchecked(runs),
                             *bound_warnings(runs, bounds)) if w)


def bound_warnings(runs: Sequence[Sample], bounds: Sequence[Bound]) -> list[str]:
    """[target.constraints] as the baseline's runs meet them: a bounded key none of them
    printed (the bound then checks nothing), and an absolute hard bound the baseline is
    already past (every change that keeps its value is discarded)."""
    out = []
    for key in dict.fromkeys(b.key for b in bounds):
        if not any(r.value(key) is not None for r in runs):
            out.append(f"[target.constraints] bounds {key}, which the baseline's runs do not "
                       f"print: the bound checks nothing until they do. Fix: print `{key}: "
                       "<value>` in the summary block")
    for b in bounds:
        values = [v for r in runs if (v := r.value(b.key)) is not None]
        mean = sum(values) / len(values) if values else None
        if b.hard and not b.relative and mean is not None and b.past(mean, b.value):
            out.append(f"the baseline's {b.key} (mean {number_text(mean)}) is already past its "
                       f"bound {b.text}: a change that does not bring it within is discarded")
    return out


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


# --- the early stop's needs ----------------------------------------------------------
EARLY_STOP = "early stop"
LINE_FIX = "print progress lines such as `step 120 | loss 3.41 | elapsed 31.2s` while training"


def check_early_stop(config: TargetConfig, lines: int, last_elapsed_s: float | None,
                     policy: PrunePolicy | None = None) -> Check:
    """Whether `prune = "auto"` can judge this target's runs: `lines` progress lines with a
    loss in one run, the last elapsed time printed on one (None: no line prints one); the
    policy is the target's [prune] table's unless given. What it lacks is a warning when the
    target asks for the early stop, a note when it is the default (the night runs as well
    without it, only without its savings)."""
    policy = policy or config.early_stop_policy()
    chosen = "prune" in config.model_fields_set
    state = f'prune = "{config.prune}"' + ("" if chosen else " (the default)")
    short: Literal["warn", "info"] = "warn" if config.prune == "auto" and chosen else "info"
    if lines == 0:
        return Check(EARLY_STOP, short,
                     f"{state}, but it cannot work: no progress line with a loss", LINE_FIX)
    needed = policy.looks  # evenly spaced, at least one line in each part of the budget
    if lines < needed:
        return Check(EARLY_STOP, short,
                     f"{state}: {lines} progress lines per run; the checks at "
                     f"{', '.join(f'{f:.0%}' for f in policy.checks)} of the budget each read "
                     f"the lines since the one before: a line at least every "
                     f"{1 / policy.looks:.0%} of it (≥ {needed})",
                     "print a progress line more often")
    if last_elapsed_s is None:
        return Check(EARLY_STOP, "info", f"{state}: can work on the service's clock (start-up "
                     "counts as training): the progress lines print no elapsed time",
                     "add `elapsed <seconds>s` (training time) to the progress lines")
    reach = last_elapsed_s / config.budget_s
    if reach < policy.checks[0]:
        return Check(EARLY_STOP, short,
                     f"{state}: the progress lines' elapsed time reaches only {reach:.0%} of the "
                     f"budget, before the first check at {policy.checks[0]:.0%}",
                     "print elapsed as training seconds since training started")
    how = "on" if config.prune == "auto" else 'possible (set prune = "auto")'
    return Check(EARLY_STOP, "ok", f"{state}: {how}: {lines} progress lines with a loss and an "
                 f"elapsed time reaching {min(reach, 1.0):.0%} of the budget")
