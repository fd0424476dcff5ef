"""The offline `knobs` proposer: a search over UPPER_CASE constants that learns from the sweep.

This module does the text side (find the constants, write the changed lines, make the diff);
the decisions are agent.proposers.policy's (effects per knob and direction with their
uncertainty, Thompson sampling, adapted steps, crash regions, plateaus, near-miss re-tests and
combinations). Deterministic for a seed and a history; no network, no API key; never proposes
a diff already tried in the sweep. A constant whose line carries `knobs: skip` is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.categories import exhausted
from agent.diff import lines_with_ends, make_diff, normalize, split_lines
from agent.domain import Experiment, Proposal
from agent.ports import ProposalContext
from agent.proposers.evidence import CONST_LINE, Change, trials
from agent.proposers.knob_space import KnobValue, parse_literal
from agent.proposers.policy import Move, plateau_status, ranked_moves


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
        m = CONST_LINE.match(line)
        if not m or "knobs: skip" in m.group("rest"):
            continue
        raw = m.group("value")
        knobs.append(Knob(path, i, m.group("name"), raw, parse_literal(raw)))
    return knobs


def edit(files: dict[str, str], knobs: dict[str, Knob], changes: tuple[Change, ...]) -> str:
    """The unified diff that sets each changed constant to its new literal."""
    new_files = {path: lines_with_ends(text) for path, text in files.items()}
    for change in changes:
        knob = knobs[change.name]
        lines = new_files[knob.path]
        m = CONST_LINE.match(lines[knob.line_no].rstrip("\r\n"))
        assert m is not None  # the line was found by the same pattern
        ending = lines[knob.line_no][len(lines[knob.line_no].rstrip("\r\n")):]
        lines[knob.line_no] = (f"{m.group('name')}{m.group('sep')}{change.new}"
                               f"{m.group('rest')}{ending}")
    return "".join(make_diff(path, files[path], "".join(new_files[path]))
                   for path in sorted(files) if "".join(new_files[path]) != files[path])


def describe(move: Move) -> str:
    parts = ", ".join(f"{c.name} {c.old} -> {c.new}" for c in move.changes)
    return parts + {"combine": " (two near-misses together)",
                    "retest": " (near-miss re-tested)"}.get(move.kind, "")


def _meta(move: Move, status: str) -> dict[str, Any]:
    first = move.changes[0]
    meta: dict[str, Any] = {"knob": first.name, "direction": first.direction, "old": first.old,
                            "new": first.new, "move": move.kind, "category": move.category.value,
                            "why": move.why, "plateau": status, **move.extra}
    if len(move.changes) > 1:
        meta["changes"] = [{"knob": c.name, "old": c.old, "new": c.new} for c in move.changes]
    return meta


class KnobsProposer:
    name = "knobs"

    def __init__(self, seed: int = 42) -> None:
        self.seed = seed

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        knobs: dict[str, Knob] = {}
        for path, text in sorted(ctx.files.items()):
            for knob in find_knobs(path, text):
                knobs.setdefault(knob.name, knob)
        head = [KnobValue(k.name, k.raw, k.value) for k in knobs.values()]
        shares = dict(ctx.sweep.config.category_shares)
        blocked = set(exhausted(ctx.history, shares, ctx.sweep.max_experiments))
        state, moves = ranked_moves(head, trials(ctx.history, ctx.sweep.direction),
                                    seed=self.seed, min_delta=ctx.sweep.min_delta,
                                    blocked=blocked)
        tried = {normalize(e.diff) for e in ctx.history if e.diff}
        for move in moves:
            diff = edit(ctx.files, knobs, move.changes)
            if diff and normalize(diff) not in tried:
                return Proposal(description=describe(move), diff=diff, proposer=self.name,
                                meta=_meta(move, plateau_status(state)))
        return None

    def repair(self, ctx: ProposalContext, failed: Experiment) -> Proposal | None:
        # A change of constants cannot be "fixed" without changing the idea itself.
        return None
