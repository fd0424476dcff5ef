"""The morning report's two checks beyond the night: does the gain hold at a larger setting
(`overnight confirm`), and validation vs the sealed holdout metric. Their Markdown and the
holdout table built from the runs.

Pure: the report model's types and the run records.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.analysis.confirm import FLIPS, HOLDS, SHRINKS, Confirmation
from agent.analysis.morning_model import Holdout, HoldoutRow
from agent.core.domain import Run, RunStatus, Sweep

VERDICT_WORDS = {HOLDS: "the gain holds", SHRINKS: "the gain shrinks",
                 FLIPS: "the gain flips", "unclear": "unclear"}


def scale_steps(sweep: str, kept: int, budget_s: float, c: Confirmation | None,
                h: Holdout | None) -> tuple[list[str], list[str]]:
    """What to try next from the confirmation and the holdout: (pressing, later)."""
    first, later = [], []
    if c is not None and c.verdict in (SHRINKS, FLIPS):
        first.append(f"the gain {c.verdict} at `{c.at}` ({c.reason}): check it at the "
                     "setting you will train at before merging")
    elif c is None and kept:
        later.append(f"check that the gain holds at a longer budget: `overnight confirm "
                     f"--sweep {sweep} --at budget={budget_s * 10:g}` (2 × 3 runs)")
    rows = {r.label: r for r in (h.rows if h is not None else ())}
    a, b = rows.get("baseline"), rows.get("best")
    if a and b and None not in (a.validation, b.validation, a.holdout, b.holdout):
        assert a.validation is not None and b.validation is not None
        assert a.holdout is not None and b.holdout is not None
        val, hold = b.validation - a.validation, b.holdout - a.holdout
        if val and (hold == 0 or (hold > 0) != (val > 0)):
            first.append(f"the holdout does not share the validation gain ({val:+.6f} vs "
                         f"{hold:+.6f}): the night fitted its validation slice")
    return first, later


def holdout_of(sweep: Sweep, baseline_commit: str | None, runs: Sequence[Run]) -> Holdout | None:
    """Validation vs holdout for the baseline and the best (None: the target names no
    holdout_metric). Sealed, with no numbers, while the sweep has not finished."""
    key = sweep.config.holdout_metric
    if not key:
        return None
    if not sweep.status.is_finished():
        return Holdout(sweep.metric, key, (), sealed=True)
    rows = []
    for label, commit in (("baseline", baseline_commit), ("best", sweep.best_commit)):
        if not commit:
            continue
        good = [r for r in runs if r.commit == commit and r.status is RunStatus.OK]
        val = [r.metric for r in good if r.metric is not None]
        hold = [r.holdout for r in good if r.holdout is not None]
        rows.append(HoldoutRow(label, commit[:7], _mean(val), len(val), _mean(hold), len(hold)))
    return Holdout(sweep.metric, key, tuple(rows))


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _num(v: float | None) -> str:
    return "–" if v is None else f"{v:.6f}"


def relative(v: float | None, ci: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:+.2%}" + (f" ± {ci:.2%}" if ci is not None else "")


def _gain(v: float | None, ci: float | None) -> str:
    return "–" if v is None else f"{v:+.6f}" + (f" ± {ci:.6f}" if ci is not None else "")


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
