"""The original `knobs` proposer, the `knobs-naive` baseline of benchmarks/search.py.

A local search: one UPPER_CASE numeric/bool constant at a time, ×2/×0.5/… or ±1.
Deterministic for a given seed and history; no network, no API key. Never repeats a diff
already tried in the sweep; keeps pushing a direction that was kept; backs off directions that
crashed. A constant whose line carries the comment `knobs: skip` is left alone.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from agent.core.diff import lines_with_ends, make_diff, normalize, split_lines
from agent.core.domain import Experiment, ExperimentStatus, Proposal
from agent.core.ports import ProposalContext

_CONST = re.compile(
    r"^(?P<name>[A-Z][A-Z0-9_]*)(?P<sep>\s*(?::\s*\w+\s*)?=\s*)"
    r"(?P<value>True|False|[-+]?(?:\d[\d_]*\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?))"
    r"(?P<rest>\s*(?:#.*)?)$"
)
# Nearby factors first; the wider ones are tried once the near ones are used up.
FLOAT_FACTORS = (2.0, 0.5, 1.5, 0.67, 1.25, 0.8, 3.0, 0.33)


@dataclass(frozen=True)
class Knob:
    path: str
    line_no: int
    name: str
    raw: str
    value: float | int | bool


def find_knobs(path: str, text: str) -> list[Knob]:
    knobs = []
    for i, line in enumerate(split_lines(text)):
        m = _CONST.match(line)
        if not m or "knobs: skip" in m.group("rest"):
            continue
        raw = m.group("value")
        value: float | int | bool
        if raw in ("True", "False"):
            value = raw == "True"
        elif re.fullmatch(r"[-+]?\d[\d_]*", raw):
            value = int(raw.replace("_", ""))
        else:
            value = float(raw)
        knobs.append(Knob(path, i, m.group("name"), raw, value))
    return knobs


def _fmt_float(new: float, raw: str) -> str:
    if "e" in raw.lower() or (new != 0 and abs(new) < 1e-3):
        mant, exp = f"{new:.2e}".split("e")
        mant = mant.rstrip("0").rstrip(".")
        return f"{mant}e{int(exp)}"
    text = f"{new:.4g}" if abs(new) < 1e4 else f"{round(new, 1):.1f}"
    return text if any(c in text for c in ".e") else text + ".0"


def _scaled(v: float, f: float) -> float:
    """Scale by f; values in (0.5, 1) (betas, momenta, decay fractions) scale their distance
    to 1 instead, so 0.95 moves to 0.975 or 0.9 and never crosses 1."""
    if 0.5 < v < 1.0:
        return 1.0 - (1.0 - v) / f
    new = v * f
    return new if not (0 < v < 1 <= new) else 1.0 - (1.0 - v) / f


def candidates(knob: Knob) -> list[tuple[int, str]]:
    """(direction, new literal) pairs for one knob, most promising first."""
    v = knob.value
    if isinstance(v, bool):
        return [(1 if not v else -1, "False" if v else "True")]
    if isinstance(v, int):
        out: list[tuple[int, str]] = []
        if v >= 2 and v & (v - 1) == 0:  # powers of two stay powers of two first
            out += [(1, str(v * 2)), (-1, str(v // 2))]
        out += [(1, str(v + 1))] + ([(-1, str(v - 1))] if v > 1 or v <= 0 else [])
        if v >= 3 and v & (v - 1) != 0:
            out += [(1, str(v * 2)), (-1, str(max(1, v // 2)))]
        return list(dict.fromkeys(out))  # first occurrence of each (direction, value)
    out = [(1 if f > 1 else -1, _fmt_float(_scaled(v, f), knob.raw)) for f in FLOAT_FACTORS]
    return [c for c in out if c[1] != knob.raw]


def _score(history: list[Experiment]) -> dict[tuple[str, int], float]:
    scores: dict[tuple[str, int], float] = {}
    for exp in history:
        knob, direction = exp.meta.get("knob"), exp.meta.get("direction")
        if knob is None or direction is None:
            continue
        key = (knob, int(direction))
        delta = {
            ExperimentStatus.KEPT: 2.0,  # push a kept direction once more...
            ExperimentStatus.DISCARDED: -1.5,  # ...but move on once it stops paying
            ExperimentStatus.CRASHED: -3.0,
            ExperimentStatus.TIMEOUT: -3.0,
        }.get(exp.status, 0.0)
        scores[key] = scores.get(key, 0.0) + delta
    return scores


def _seen_values(history: list[Experiment]) -> dict[str, set[str]]:
    """Values each knob has already been evaluated at (so a kept change is never reverted)."""
    seen: dict[str, set[str]] = {}
    for exp in history:
        knob = exp.meta.get("knob")
        if knob is None or exp.status is ExperimentStatus.REJECTED:
            continue
        seen.setdefault(knob, set()).add(str(exp.meta.get("new")))
        if exp.status is ExperimentStatus.KEPT:
            seen[knob].add(str(exp.meta.get("old")))
    return seen


class NaiveKnobsProposer:
    name = "knobs-naive"
    out_of_ideas: str | None = None

    def __init__(self, seed: int = 42) -> None:
        self.seed = seed

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        tried = {normalize(e.diff) for e in ctx.history if e.diff}
        seen = _seen_values(ctx.history)
        scores = _score(ctx.history)
        rng = random.Random(f"{self.seed}:{len(ctx.history)}")
        options = []
        for path, text in sorted(ctx.files.items()):
            lines = lines_with_ends(text)
            for knob in find_knobs(path, text):
                for rank, (direction, literal) in enumerate(candidates(knob)):
                    new_line = lines[knob.line_no].replace(knob.raw, literal, 1)
                    new_text = "".join(
                        lines[: knob.line_no] + [new_line] + lines[knob.line_no + 1 :]
                    )
                    diff = make_diff(path, text, new_text)
                    if literal in seen.get(knob.name, ()) or normalize(diff) in tried:
                        continue
                    score = (
                        scores.get((knob.name, direction), 0.0) - 0.1 * rank + rng.random() * 0.2
                    )
                    options.append((score, knob, direction, literal, diff))
        if not options:
            return None
        score, knob, direction, literal, diff = max(options, key=lambda o: o[0])
        return Proposal(
            description=f"{knob.name} {knob.raw} -> {literal}",
            diff=diff,
            proposer=self.name,
            meta={"knob": knob.name, "direction": direction, "old": knob.raw, "new": literal},
        )

    def repair(self, ctx: ProposalContext, failed: Experiment) -> Proposal | None:
        # A one-constant change cannot be "fixed" without changing the idea itself.
        return None
