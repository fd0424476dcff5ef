"""What to try next, read off a morning report and the sweep's digest: a few plain sentences,
most pressing first (the attribution's flags, weak keeps, a gain inside the noise, near-misses,
promising directions, the plateau, crash regions).

Pure: the report model and the digest only.
"""

from __future__ import annotations

from agent.analysis.ablation import HELPS, UNMEASURED
from agent.analysis.insights import Insights
from agent.analysis.morning_model import Report
from agent.analysis.trials import PLATEAU_AFTER

MAX_STEPS = 8
MAX_DIRECTIONS = 2


def next_steps(report: Report, ins: Insights) -> list[str]:
    """At most MAX_STEPS suggestions for the next night."""
    steps = [*_from_attribution(report), *_from_evidence(report), *_from_digest(ins),
             *_from_crashes(report)]
    if not steps:
        steps.append("nothing stands out: another night with the same search, or a bigger "
                     "budget to tell smaller effects apart")
    return steps[:MAX_STEPS]


def _from_attribution(report: Report) -> list[str]:
    a = report.attribution
    if a is None:
        if len(report.kept) >= 2:
            return [f"attribute the gain to each kept change: `overnight finalize --sweep "
                    f"{report.sweep} --ablate` ({report.ablation_cost} runs)"]
        return []
    out = []
    for c in a.changes:
        if c.verdict in (HELPS, UNMEASURED):
            continue
        out.append(f"#{c.id} {c.description[:60]}: {c.verdict} ({_pm(c.gain, c.ci)}); "
                   + ("consider dropping it before merging" if c.gain is not None
                      and c.ci is not None and c.gain - c.ci <= 0 else
                      "keep it together with the changes it works with"))
    if a.additive is False:
        out.append("the kept changes interact (their leave-one-out gains do not add up): "
                   "merge them as one chain, not one by one")
    return out


def _from_evidence(report: Report) -> list[str]:
    h = report.headline
    out = []
    weak = [k for k in report.kept if not k.supported]
    if weak:
        ids = ", ".join(f"#{k.id}" for k in weak[:4])
        out.append(f"confirm the keeps on weak evidence ({ids}): re-run them with more seeds "
                   "before relying on them")
    if h.improvement is not None and h.improvement_ci is not None and h.kept and \
            h.improvement - h.improvement_ci <= 0:
        out.append("the night's gain is within the noise: more runs per change (max_runs) or a "
                   "longer budget")
    return out


def _from_digest(ins: Insights) -> list[str]:
    out = []
    if ins.near_misses:
        shown = ", ".join(n.split(":")[0] for n in ins.near_misses[:4])
        out.append(f"re-test or combine the near-misses ({shown}: discarded within the noise "
                   "of the best)")
    found = []
    for k in ins.knobs:
        for e in k.effects:
            err = e.stderr or 0.0
            if e.mean_gain > 0 and e.mean_gain > err and e.kept < e.runs:
                measured = e.runs - e.stopped  # a stopped change has no gain
                found.append(f"{k.name} {e.direction} ({e.mean_gain:+.3g} over {measured} run"
                             f"{'s' if measured > 1 else ''})")
    if found:
        out.append("push further where the effect was positive: "
                   + ", ".join(found[:MAX_DIRECTIONS]))
    if ins.plateau.startswith("plateau"):
        out.append(f"the search ended on a plateau (over {PLATEAU_AFTER} runs without a keep): "
                   "another area, bigger steps, or a language-model proposer")
    return out


def _from_crashes(report: Report) -> list[str]:
    ran = sum(report.counts.get(s, 0) for s in ("kept", "discarded", "crashed", "timeout"))
    crashed = sum(g.count for g in report.crashes)
    if not ran or crashed / ran < 0.25:
        return []
    top = report.crashes[0]
    return [f"{crashed} of {ran} runs crashed or timed out (most: {top.cause}, "
            f"{top.count}×): fix that before the next night"]


def _pm(value: float | None, ci: float | None) -> str:
    if value is None:
        return "not measured"
    return f"{value:+.4g}" + (f" ± {ci:.2g}" if ci is not None else "")
