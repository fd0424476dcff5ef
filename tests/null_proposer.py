"""Ideas: a proposer of null changes (IDEA = 1, 2, ...) that leave the metric's distribution
as it was, for measuring how often a keep rule keeps noise. Used by tests/test_runs.py and
benchmarks/null_sweep.py (which puts tests/ on sys.path)."""

from __future__ import annotations

import re

from agent.core.domain import Experiment, Proposal
from agent.core.ports import ProposalContext
from agent.proposers.knobs import make_diff


class Ideas:
    name = "ideas"
    out_of_ideas: str | None = None

    def __init__(self) -> None:
        self.k = 0

    def propose(self, ctx: ProposalContext) -> Proposal | None:
        self.k += 1
        text = ctx.files["train.py"]
        new = re.sub(r"^IDEA = \d+", f"IDEA = {self.k}", text, count=1, flags=re.M)
        return Proposal(f"idea {self.k}", make_diff("train.py", text, new), self.name)

    def repair(self, ctx: ProposalContext, failed: Experiment) -> Proposal | None:
        return None
