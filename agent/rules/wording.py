"""The keep rule's numbers as a person reads them: what runs measured (a mean and its n), what the
rule inferred (a difference ± its standard error), and the reference each comparison is against,
named. The reasons the rule writes and every screen use these, so one fact reads one way.

Pure: the stdlib, config, bounds and the record only.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.core.bounds import BoundCheck
from agent.core.config import Direction
from agent.core.record import Measured


def runs_word(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"


def metric_text(value: float) -> str:
    """A metric's value as every screen writes it: six decimals ("3.375499")."""
    return f"{value:.6f}"


def value_text(m: Measured | None) -> str:
    """"3.375499 on 1 run" / "mean 6.050750 of 4 runs" / "no run measured it"."""
    if m is None or m.mean is None:
        return "no run measured it"
    if m.n == 1:
        return f"{metric_text(m.mean)} on 1 run"
    return f"mean {metric_text(m.mean)} of {m.n} runs"


def reference_text(compared: Measured, beside: bool, conditions: int = 1,
                   by_speed: bool = True) -> str:
    """The incumbent runs a change was compared with: "the incumbent's run beside it (3.5515)",
    "the incumbent's 3 runs at its speed (mean 6.05583)"; compared in several machine
    conditions, no single mean stands for them: "the incumbent's 8 runs at its speed, in 2
    machine conditions (within each)". On a compute budget (`by_speed` False) no speed is
    named: "the incumbent's 5 runs (mean 3.524966)"."""
    which = "beside it" if beside else "at its speed" if by_speed else ""
    which = f" {which}" if which else ""
    if conditions > 1:
        return (f"the incumbent's {compared.n} runs{which}, in {conditions} machine conditions "
                "(within each)")
    assert compared.mean is not None
    if compared.n == 1:
        return f"the incumbent's run{which} ({metric_text(compared.mean)})"
    return f"the incumbent's {compared.n} runs{which} (mean {metric_text(compared.mean)})"


def gain_text(difference: float, se: float | None, direction: Direction) -> tuple[str, str]:
    """("better than", " by 0.175947 ± 0.302") from a difference (change − reference, signed
    as the metric) and its standard error: the gain with six decimals, as every screen writes
    a metric, the standard error with three significant digits."""
    gain = -difference if direction is Direction.MINIMIZE else difference
    word = "better than" if gain > 0 else "worse than" if gain < 0 else "equal to"
    by = "" if gain == 0 else f" by {metric_text(abs(gain))}" + (
        f" ± {se:.3g}" if se is not None else "")
    return word, by


def comparison(change: Measured, compared: Measured | None, difference: float | None,
               se: float | None, direction: Direction, beside: bool = False,
               conditions: int = 1, by_speed: bool = True) -> str:
    """"3.3755 on 1 run: better than the incumbent's run beside it (3.5515) by 0.176 ± 0.302"."""
    own = value_text(change)
    if compared is None or compared.mean is None or difference is None:
        return own
    word, by = gain_text(difference, se, direction)
    return f"{own}: {word} {reference_text(compared, beside, conditions, by_speed)}{by}"


def best_then_text(best: Measured | None) -> str:
    """"the best then, 6.05583 on 3 runs"."""
    if best is None or best.mean is None:
        return "no best then"
    return f"the best then, {value_text(best)}"


def speed_text(speed: float, source: str | None) -> str:
    """A throughput as a person reads it: 16,320 tokens/s, 2.41 steps/s."""
    unit = "tokens/s" if source and "tokens" in source else "steps/s"
    return f"{speed:,.0f} {unit}" if speed >= 100 else f"{speed:.3g} {unit}"


def other_speed_note(speed: float | None, usual_speed: float | None, source: str | None) -> str:
    """The note of a run placed in another machine condition than the usual one."""
    at = "an unknown speed" if speed is None else speed_text(speed, source)
    usual = (f" (the incumbent usually runs at {speed_text(usual_speed, source)})"
             if usual_speed else "")
    return (f"ran at {at}{usual}: the machine's load changed, so it is compared with the "
            "incumbent's runs at that speed")


def set_aside_note(incumbent_run: int) -> str:
    """The note of a run whose pair disagrees with its other pairs on its speed."""
    return (f"set aside: its speed relative to the incumbent's run {incumbent_run} beside it "
            "differs from its other pairs, so the machine's speed changed between the two runs")


def unplaced_note(speed: float, source: str | None, ratio_known: bool) -> str:
    """The note of a run at a speed the incumbent has not run at: set aside until the
    incumbent runs beside it."""
    return (f"ran at {speed_text(speed, source)}, a speed the incumbent has not run at"
            + ("" if ratio_known else " (this change's own effect on speed is not measured "
               "yet)") + ", so the incumbent runs next to it")


def lines_text(lines: int) -> str:
    """"12 lines fewer" / "1 line more"."""
    n = abs(lines)
    return f"{n} line{'s' if n != 1 else ''} {'fewer' if lines < 0 else 'more'}"


def margin_text(bounds: Sequence[BoundCheck], lines: int | None, margin: float | None) -> str:
    """What a test asked beyond min_delta, for a reason's end: "; peak_vram_mb 1300 (mean of 2
    runs) is 30 % over its bound <= 1 x incumbent = 1000: it asks 0.015000 more gain", "; a
    simplification (12 lines fewer): kept unless worse by more than 0.010000"; "" when nothing
    was asked beyond min_delta."""
    notes = [f"{c.text()}: it asks {metric_text(c.cost)} more gain" for c in bounds if c.cost]
    if margin is not None and margin < 0 and lines is not None and lines < 0:
        notes.append(f"a simplification ({lines_text(lines)}): kept unless worse by more than "
                     f"{metric_text(-margin)}")
    elif margin is not None and notes:
        notes.append(f"so the gain must exceed {metric_text(margin)}")
    return "".join(f"; {n}" for n in notes)
