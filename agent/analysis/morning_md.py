"""The morning report as Markdown (for a pull request, a chat or a terminal): one page, the
same model the HTML page draws (agent.analysis.morning), with the confirmation at a larger
setting and the validation vs holdout table.

Pure. Metric-scale numbers are written with six decimals (as `overnight results` writes them),
Hours to four significant digits, dollars with four decimals, so a reader can check them
against the records.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from agent.analysis.ablation import Attribution
from agent.analysis.confirm import FLIPS, HOLDS, SHRINKS, Confirmation
from agent.analysis.counts import Counts
from agent.analysis.morning import Cost, CrashGroup, Holdout, HoldoutRow, KeptChange, Report
from agent.analysis.words import REPORT_TERMS, TERMS


def metric(v: float | None) -> str:
    return "–" if v is None else f"{v:.6f}"


def signed(v: float | None) -> str:
    return "–" if v is None else f"{v:+.6f}"


def pm(v: float | None, ci: float | None) -> str:
    """A signed value ± its 95 % half-width."""
    if v is None:
        return "–"
    return signed(v) + (f" ± {ci:.3g}" if ci is not None else "")


def headline_gain(v: float | None, ci: float | None) -> str:
    """The night's gain as every screen's headline writes it: six decimals ± three digits."""
    if v is None:
        return "–"
    return (f"{v + 0.0:+.6f}" if round(v, 6) != 0 else "0.000000") + (
        f" ± {ci:.3g}" if ci is not None else "")


def hours(v: float) -> str:
    """Hours to four significant digits, never in exponent form (a short night's runs
    take a few thousandths of an hour), at least three decimals."""
    if v <= 0 or not math.isfinite(v):
        return f"{v:.3f}"
    return f"{v:.{max(3, 3 - math.floor(math.log10(v)))}f}"


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def counts_line(n: Counts) -> str:
    """"2 of 6 changes kept (the baseline aside), 3 discarded, 1 crashed; 17 runs, 4 set
    aside": the counts every screen shares (agent.analysis.counts)."""
    parts = [n.kept_text()]
    parts += [f"{v} {word}" for v, word in ((n.discarded, "discarded"), (n.crashed, "crashed"),
                                            (n.refused, "refused before running")) if v]
    runs = f"{n.runs} run{'s' if n.runs != 1 else ''}" + (
        f", {n.set_aside} set aside" if n.set_aside else "") + (
        f", {n.reruns} of them re-runs of kept commits" if n.reruns else "")
    return ", ".join(parts) + "; " + runs


def span(r: Report) -> str:
    """When the sweep ran: its creation to its last finish, and how long that was."""
    start = r.created_at.strftime("%Y-%m-%d %H:%M UTC")
    if r.last_finish is None:
        return f"created {start}"
    hours = (r.last_finish - r.created_at).total_seconds() / 3600
    return f"{start} → {r.last_finish.strftime('%Y-%m-%d %H:%M UTC')} ({hours:.2f} h)"


def set_aside(n: int) -> str:
    """The runs in no value because their throughput said they measured the load."""
    runs = "1 run" if n == 1 else f"{n} runs"
    return (f"{runs} set aside (a run's speed said the machine's load had changed, so it "
            "measured the load, not the change): in no mean, interval or n here")


def render_markdown(r: Report) -> str:
    parts = [_head(r), _kept(r), attribution_markdown(r.attribution) if r.attribution else "",
             confirmation_markdown(r.confirmation) if r.confirmation else "",
             holdout_markdown(r.holdout) if r.holdout else "",
             _learned(r), _crashes(r.crashes), _cost(r.cost), _next(r), _words()]
    return "\n\n".join(p for p in parts if p).rstrip() + "\n"


def _words() -> str:
    """The terms the report uses, each in one sentence (agent.analysis.words)."""
    return "\n".join(["## What the words mean", "",
                      *[f"- **{TERMS[k][0]}**: {TERMS[k][1]}" for k in REPORT_TERMS]])


def _head(r: Report) -> str:
    h = r.headline
    better = "lower" if h.direction == "minimize" else "higher"
    rel = f" ({h.relative:+.2%})" if h.relative is not None else ""
    lines = [f"# Sweep `{r.sweep}`: the morning report", ""]
    if h.baseline is None:
        lines.append(f"**{h.metric}: no baseline measured yet.**")
    else:
        lines.append(f"**{h.metric} {metric(h.baseline)} → {metric(h.best)}** ({better} is "
                     f"better; baseline n={h.baseline_n}, best n={h.best_n}): gain "
                     f"{headline_gain(h.improvement, h.improvement_ci)}{rel} (95 % interval).")
    if h.set_aside:
        lines += ["", f"{set_aside(h.set_aside)}."]
    lines += ["", f"**{h.statement}**", "",
              f"Status {r.status}, {span(r)}; {counts_line(r.night)}; budget {r.budget_text} "
              f"per run; proposer `{r.proposer}`; branch `{r.branch}`; target `{r.target}`."]
    return "\n".join(lines)


def _kept(r: Report) -> str:
    lines = ["## Kept changes (baseline → best)", ""]
    if not r.kept:
        return "\n".join([*lines, "Nothing was kept: the branch is the baseline."])
    extra = "".join(f" {key}: mean of its runs (measured) |" for key in r.secondary)
    lines += [f"| # | change | {r.headline.metric}: mean of its runs (measured) | n | "
              "Δ vs the incumbent runs it was compared with (inferred, ± se) | P(better) |"
              f"{extra} diff |", "| --- " * (7 + len(r.secondary)) + "|"]
    lines += [_kept_row(k) for k in r.kept]
    lines += ["", "The value is the mean of the change's own runs; Δ is the keep rule's estimate "
              "of its difference from the incumbent runs it was compared with (within machine "
              "conditions), ± its standard error. P(better) is the keep rule's; ✓ marks a keep "
              "the test made at the night's false-discovery level (the others were kept on one "
              "run, the noise not measured). A change that removes lines is kept when it is not "
              "worse by more than the simplicity margin (\"simpler\"), and a keep that adds "
              "lines for a gain under that margin is flagged."]
    return "\n".join(lines)


def _kept_row(k: KeptChange) -> str:
    mean = metric(k.mean) + (f" ({k.now})" if k.now else "")
    p = "–" if k.p_better is None else f"{k.p_better:.2f}" + (" ✓" if k.supported else "")
    files = ", ".join(k.files) or "–"
    delta = signed(k.delta) + (f" ± {k.se:.3g}" if k.delta is not None and k.se is not None
                               else "")
    extra = "".join(f" {m.text} |" for m in k.secondary)  # agent.analysis.secondary
    note = f" — {cell(k.weighed)}" if k.weighed else ""
    return (f"| {k.id} | {cell(k.description)} (`{k.commit}`){note} | {mean} | {k.n} | "
            f"{delta} | {p} |{extra} {cell(files)} +{k.added} −{k.removed} |")


def attribution_markdown(a: Attribution) -> str:
    lines = [f"## Attribution (leave-one-out, sweep `{a.sweep}`, {a.seeds} seeds per variant, "
             f"{a.runs} runs)", ""]
    sigma = f"σ̂ {a.sigma:.3g} ({a.df} df)" if a.sigma is not None else "σ̂ not measured"
    lines.append(f"Measured again now: baseline {metric(a.baseline)} → best {metric(a.best)}, "
                 f"gain {pm(a.total, a.total_ci)}; {sigma}.")
    alone = len(a.changes) == 1  # one kept change: there are no others to be on top of
    gain = "gain over the baseline" if alone else "gain on top of the others"
    lines += ["", f"| # | change | {gain} (± 95 %) | gain when kept | verdict |",
              "| --- | --- | --- | --- | --- |"]
    for c in a.changes:
        verdict = c.verdict + (f" ({cell(c.note)})" if c.note else "")
        lines.append(f"| {c.id} | {cell(c.description)} | {pm(c.gain, c.ci)} | "
                     f"{pm(c.night_gain, c.night_ci)} | {verdict} |")
    if a.interaction is not None:
        sums = a.sum_of_gains
        word = ("they add up" if a.additive else "they do not add up: the changes interact")
        lines += ["", f"The leave-one-out gains sum to {signed(sums)} against the whole "
                  f"chain's {signed(a.total)} (difference {pm(a.interaction, a.interaction_ci)}"
                  f"): {word}."]
    lines += [f"- {n}" for n in a.notes]
    return "\n".join(lines)


def _learned(r: Report) -> str:
    lines = ["## What was learned", "", r.plateau]
    for heading, body in r.learned:
        lines += ["", f"### {heading}", "", *body]
    return "\n".join(lines)


def _crashes(groups: list[CrashGroup]) -> str:
    lines = ["## Crashes and timeouts", ""]
    if not groups:
        return "\n".join([*lines, "None."])
    lines += ["| status | kind | cause | n | experiments |", "| --- | --- | --- | --- | --- |"]
    for g in groups:
        more = " …" if g.count > len(g.ids) else ""
        ids = ", ".join(f"#{i}" for i in g.ids) + more
        lines.append(f"| {g.status} | {g.kind} | {cell(g.cause)} | {g.count} | {ids} |")
    return "\n".join(lines)


def _cost(c: Cost) -> str:
    on = f" (runs on {', '.join(c.devices)})" if c.devices else ""
    lines = [f"## Cost{on}", "", f"| for | runs | {c.unit} |", "| --- | --- | --- |"]
    lines += [f"| {x.status} | {x.runs} | {hours(x.hours)} |" for x in c.lines]
    lines.append(f"| total | {c.runs} | {hours(c.hours)} |")
    lines += ["", f"{c.unit} are the runs' wall time, start-up and evaluation "
              "included (one slot each)."]
    if c.llm_tokens_in or c.llm_tokens_out or c.llm_usd:
        lines.append(f"Language model: {c.llm_tokens_in:,} tokens in, {c.llm_tokens_out:,} "
                     f"out, ${c.llm_usd:.4f} (estimated).")
    else:
        lines.append("Language model: none used (0 tokens, $0.0000).")
    return "\n".join(lines)


def _next(r: Report) -> str:
    return "\n".join(["## What to try next", "", *[f"- {s}" for s in r.next_steps]])


# --- the confirmation and the holdout ---------------------------------------------------------
VERDICT_WORDS = {HOLDS: "the gain holds", SHRINKS: "the gain shrinks",
                 FLIPS: "the gain flips", "unclear": "unclear"}



def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:.6f}"


def relative(v: float | None, ci: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:+.2%}" + (f" ± {ci:.2%}" if ci is not None else "")


def _gain(v: float | None, ci: float | None) -> str:
    return "–" if v is None else f"{v:+.6f}" + (f" ± {ci:.3g}" if ci is not None else "")


def confirmation_markdown(c: Confirmation) -> str:
    gain = _gain(c.gain, c.gain_ci)
    lines = [f"## Does the gain hold at scale? (`{c.at}`, sweep `{c.sweep}`, {c.seeds} seeds "
             f"each, {c.runs} runs)", "",
             f"**{VERDICT_WORDS.get(c.verdict, c.verdict)}**: {c.reason}.", "",
             "| setting | baseline | best | gain (± 95 %) | relative gain (± 95 %) |",
             "| --- | --- | --- | --- | --- |",
             f"| the night | {_num(c.night_baseline)} | – | "
             f"{_gain(c.night_gain, c.night_gain_ci)} | "
             f"{relative(c.night_relative, c.night_relative_ci)} |",
             f"| `{c.at}` | {_num(c.baseline)} (n={c.baseline_n}) | {_num(c.best)} "
             f"(n={c.best_n}) | {gain} | {relative(c.relative, c.relative_ci)} |", "",
             "Relative gains are against each setting's own baseline (a larger setting moves "
             "the metric's scale)."]
    return "\n".join(lines)


def holdout_markdown(h: Holdout) -> str:
    lines = [f"## Validation vs holdout (`{h.metric}` vs sealed `{h.holdout_metric}`)", ""]
    if h.sealed:
        return "\n".join([*lines, "Sealed while the sweep runs: shown once it has ended."])
    lines += [f"| commit | {h.metric} (validation) | {h.holdout_metric} (holdout) |",
              "| --- | --- | --- |"]
    lines += [f"| {r.label} `{r.commit}` | {_num(r.validation)} (n={r.validation_n}) | "
              f"{_num(r.holdout)} (n={r.holdout_n}) |" for r in h.rows]
    gap = _gaps(h.rows)
    if gap:
        lines += ["", gap]
    lines += ["", "No proposer saw the holdout during the night; a gain on validation that "
              "is absent on the holdout was fitted to the validation slice."]
    return "\n".join(lines)


def _gaps(rows: Sequence[HoldoutRow]) -> str:
    by = {r.label: r for r in rows}
    a, b = by.get("baseline"), by.get("best")
    if a is None or b is None or None in (a.validation, b.validation, a.holdout, b.holdout):
        return ""
    assert a.validation is not None and b.validation is not None
    assert a.holdout is not None and b.holdout is not None
    return (f"Baseline → best: validation {b.validation - a.validation:+.6f}, holdout "
            f"{b.holdout - a.holdout:+.6f}.")
