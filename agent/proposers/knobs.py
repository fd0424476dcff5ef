"""The offline `knobs` proposer: a search over a target's knobs that learns from the sweep.

Knobs are found by agent.proposers.knob_sources (config-block globals, constants, argparse
defaults, dataclass fields, config-file keys, args_file lines); each rewrites its own literal.
Only live ones are proposed: agent.proposers.knob_chain drops those a later layer overrides.

This module does the text side (write the changed lines, make the diff);
the decisions are agent.proposers.policy's (effects per knob and direction with their
uncertainty, Thompson sampling, adapted steps, crash regions, plateaus, near-miss re-tests and
combinations). Deterministic for a seed and a history; no network, no API key; never proposes
a diff already tried in the sweep. A constant whose line carries `knobs: skip` is left alone.
"""

from __future__ import annotations

from typing import Any

from agent.analysis.trials import Change, trials
from agent.core.diff import lines_with_ends, make_diff, normalize
from agent.core.domain import Experiment, Proposal
from agent.core.ports import ProposalContext
from agent.proposers.knob_chain import resolve
from agent.proposers.knob_sources import Knob, find_knobs, no_knobs_message
from agent.proposers.policy import Move, plateau_status, ranked_moves
from agent.rules.categories import category_of_knob, exhausted
from agent.rules.knob_space import KnobValue


def edit(files: dict[str, str], knobs: dict[str, Knob], changes: tuple[Change, ...]) -> str:
    """The unified diff that sets each changed constant to its new literal."""
    new_files = {path: lines_with_ends(text) for path, text in files.items()}
    for change in changes:
        knob = knobs[change.name]
        lines = new_files[knob.path]
        lines[knob.line_no] = knob.rewrite(lines[knob.line_no], change.new)
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


__all__ = ["Knob", "KnobsProposer", "find_knobs", "knob_proposal", "make_diff"]


def knob_proposal(files: dict[str, str], values: tuple[tuple[str, str], ...],
                  proposer: str = "knobs") -> Proposal:
    """A chosen move: each named constant set to a literal (("DEPTH", "2"),), described and
    recorded as the search's own moves are. Raises ValueError for a knob the files lack or a
    value that changes nothing."""
    knobs: dict[str, Knob] = {}
    for path, text in files.items():
        for knob in find_knobs(path, text):
            knobs.setdefault(knob.name, knob)
    missing = [name for name, _ in values if name not in knobs]
    if missing:
        raise ValueError(f"no knob {', '.join(missing)} in {', '.join(sorted(files))}")
    changes = tuple(Change(name, knobs[name].raw, new) for name, new in values)
    diff = edit(files, knobs, changes)
    if not diff:
        raise ValueError(f"{values} changes nothing")
    move = Move(changes, "chosen", 0.0, "chosen before the night",
                category_of_knob(changes[0].name))
    meta = _meta(move, "")
    del meta["plateau"]
    return Proposal(description=describe(move), diff=diff, proposer=proposer, meta=meta)


class KnobsProposer:
    name = "knobs"

    def __init__(self, seed: int = 42) -> None:
        self.seed = seed
        self.out_of_ideas: str | None = None

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        config = ctx.sweep.config
        knobs: dict[str, Knob] = {}
        dead: list[str] = []
        for found in resolve(ctx.files, config.command, config.args_file, config.workdir):
            # dead knobs (a later layer sets them) are never proposed; string choices: not
            # searched (yet)
            if not found.live:
                dead.append(f"{found.knob.name} at {found.knob.where}: {found.why}")
            elif found.searched:  # not plumbing such as seed or device
                knobs.setdefault(found.knob.name, found.knob)
        # Read by the loop when propose() returns None: a reason instead of a silent `done`.
        self.out_of_ideas = None if knobs else no_knobs_message(ctx.files, dead)
        head = [KnobValue(k.name, k.raw, k.value) for k in knobs.values()
                if not isinstance(k.value, str)]
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
