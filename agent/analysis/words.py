"""The words a newcomer meets on every screen, each explained once: the console's legend, the
dashboard's tooltips and its "What the words mean" list, and the morning report's end read
these, so a term means the same everywhere. `why_not_kept` says in one sentence why a change
whose P(better) was high was still not kept.

Pure: the stdlib, the record and the rules' wording only.
"""

from __future__ import annotations

from agent.core.record import Ending, VerdictRecord
from agent.rules.wording import lines_text, metric_text

# term -> one plain sentence; the keys are what templates and the console look up
TERMS: dict[str, tuple[str, str]] = {
    "measured": ("measured",
                 "the mean of the change's own runs, and n, how many runs that mean is of."),
    "incumbent": ("incumbent",
                  "the commit the night has kept so far (the baseline until a change is kept); "
                  "each change is compared with runs of it."),
    "delta": ("Δ (inferred)",
              "the keep rule's estimate of how far the change's runs differ from the incumbent "
              "runs it was compared with (beside it, or at the same machine speed), in the "
              "metric's units, ± one standard error; no run measured this number."),
    "p_better": ("P(better)",
                 "the keep rule's confidence that the change is better than those incumbent runs. "
                 "It is not the keep test: a keep also needs its p at or below the level, so a "
                 "change at P(better) 0.9 can still be discarded or run again."),
    "p": ("p, level",
          "p: how often noise alone would show a gain this large if the change did nothing, "
          "scaled up for the looks the test takes as the change's runs come in; level: the bar "
          "p must clear, the part of the night's false-keep budget (fdr) this test may spend."),
    "sigma": ("σ̂ (sigma hat)",
              "the estimated spread (standard deviation) of the metric between runs of the same "
              "code with different seeds, pooled over the night."),
    "df": ("df",
           "degrees of freedom: how many independent repeats σ̂ rests on; the fewer, the less "
           "certain σ̂, and the larger a gain must be to be kept."),
    "set_aside": ("set aside",
                  "runs left out of a comparison because the machine ran at another speed "
                  "then; they are recorded and shown, never compared across speeds."),
    "reruns": ("re-runs",
               "runs of a kept commit made later, beside newer changes; they update its value "
               "now."),
    "role": ("role",
             "baseline: a run of the unchanged script that starts the night; screen: a change's "
             "first run; confirm: its later runs; incumbent: the kept commit run again, beside "
             "a change's run (\"beside run N\")."),
    "simpler": ("simpler",
                "a change that removes lines (net, in the editable files), kept because it is not "
                "worse than the incumbent by more than the simplicity margin the target sets; "
                "a keep that adds lines for a gain under that margin is flagged."),
    "bound": ("over a bound",
              "discarded because a summary key its runs printed (peak memory, throughput) is "
              "past a hard bound of the target's [target.constraints], whatever its metric; a "
              "soft bound instead asks a larger gain for a larger cost."),
    "detectable": ("smallest detectable effect",
                   "the smallest true gain a change would have kept half the time, by its "
                   "last run, at the night's noise."),
}


# the terms the morning report explains at its end
REPORT_TERMS = ("measured", "delta", "incumbent", "p_better", "sigma", "df", "set_aside")


def term(key: str) -> str:
    """"σ̂ (sigma hat): the estimated spread …" for a legend line."""
    name, text = TERMS[key]
    return f"{name}: {text}"


def legend(keys: tuple[str, ...] = ("measured", "delta", "incumbent", "p_better", "sigma",
                                    "df")) -> list[str]:
    """The console's legend under a results table: one line a term."""
    return [term(k) for k in keys]


def why_not_kept(rec: VerdictRecord | None) -> str | None:
    """A change judged and not kept, in one sentence that names what it lacked: "P(better) 0.64
    is not enough: a keep needs p at or below the level, and its p was 0.31 against a level of
    0.013" (p and the level with two digits, as the reason writes them). None where there is
    nothing to say (kept, probably worse, or never judged)."""
    if rec is None or rec.ending not in (Ending.NOT_BETTER, Ending.STOPPED_EARLY):
        return None
    if rec.p_better is None or rec.p_better < 0.5:
        return None
    if rec.p is not None and rec.level is not None:
        return (f"P(better) {rec.p_better:.2f} is not enough: a keep needs p at or below the "
                f"level, and its p was {rec.p:.2g} against a level of {rec.level:.2g}.")
    return (f"P(better) {rec.p_better:.2f} is not enough: a keep needs a test at the night's "
            "level, and this change was not given one.")


def weighed(rec: VerdictRecord | None, simplicity_margin: float, minimize: bool) -> str:
    """What a keep weighed besides its metric, in one sentence (every screen that shows a
    keep's gain says it beside it): "simpler: 9 lines fewer, kept as not worse than the
    incumbent by more than 0.050000"; "small gain for its code: 40 lines more for a gain of
    0.001000, under the simplicity margin 0.050000"; "peak_memory_mb is 30 % over its bound
    …: it was asked 0.015000 more gain". "" when it weighed nothing else."""
    if rec is None or rec.ending is not Ending.KEPT:
        return ""
    notes = [f"{c.text()}: it was asked {metric_text(c.cost)} more gain"
             for c in rec.bounds if c.cost]
    gain = rec.gain(minimize)
    if rec.simpler and rec.lines is not None:
        notes.insert(0, f"simpler: {lines_text(rec.lines)}, kept as not worse than the incumbent "
                        f"by more than {metric_text(simplicity_margin)}")
    elif simplicity_margin > 0 and rec.lines is not None and rec.lines > 0 and gain is not None \
            and gain < simplicity_margin:
        notes.insert(0, f"small gain for its code: {lines_text(rec.lines)} for a gain of "
                        f"{metric_text(gain)}, under the simplicity margin "
                        f"{metric_text(simplicity_margin)}")
    return "; ".join(notes)
