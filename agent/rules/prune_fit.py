"""Can the early stop of losing runs work for a target? From one run of its unmodified HEAD.

Pure: the stdlib, agent.core.config and agent.rules (contract's Check, prune's policy). The early
stop (agent.rules.prune) judges a run's training loss at fractions of the budget, each as the
median of its progress lines in a window ending there: it needs progress lines with a loss, a
line in every check's window (lines at least every `window` of the budget), and is exact only
with an elapsed training time on the lines (else the service's clock, start-up included).
"""

from __future__ import annotations

from typing import Literal

from agent.core.config import TargetConfig
from agent.rules.contract import Check
from agent.rules.prune import PrunePolicy

NAME = "early stop"
LINE_FIX = "print progress lines such as `step 120 | loss 3.41 | elapsed 31.2s` while training"


def check_early_stop(config: TargetConfig, lines: int, last_elapsed_s: float | None,
                     policy: PrunePolicy | None = None) -> Check:
    """Whether `prune = "auto"` can judge this target's runs: `lines` progress lines with a
    loss in one run, the last elapsed time printed on one (None: no line prints one); the
    policy is the target's [prune] table's unless given. What it lacks is a warning when the
    target asks for the early stop, a note when it is the default (the night runs as well
    without it, only without its savings)."""
    policy = policy or config.prune_policy.policy()
    chosen = "prune" in config.model_fields_set
    state = f'prune = "{config.prune}"' + ("" if chosen else " (the default)")
    short: Literal["warn", "info"] = "warn" if config.prune == "auto" and chosen else "info"
    if lines == 0:
        return Check(NAME, short,
                     f"{state}, but it cannot work: no progress line with a loss", LINE_FIX)
    needed = int(policy.checks[-1] / policy.window) + 1  # a line in each check's window
    if lines < needed:
        return Check(NAME, short,
                     f"{state}: {lines} progress lines per run; the checks at "
                     f"{', '.join(f'{f:.0%}' for f in policy.checks)} of the budget need a line "
                     f"at least every {policy.window:.0%} of it (≥ {needed})",
                     "print a progress line more often")
    if last_elapsed_s is None:
        return Check(NAME, "info", f"{state}: can work on the service's clock (start-up counts "
                     "as training): the progress lines print no elapsed time",
                     "add `elapsed <seconds>s` (training time) to the progress lines")
    reach = last_elapsed_s / config.budget_s
    if reach < policy.checks[0]:
        return Check(NAME, short,
                     f"{state}: the progress lines' elapsed time reaches only {reach:.0%} of the "
                     f"budget, before the first check at {policy.checks[0]:.0%}",
                     "print elapsed as training seconds since training started")
    how = "on" if config.prune == "auto" else 'possible (set prune = "auto")'
    return Check(NAME, "ok", f"{state}: {how}: {lines} progress lines with a loss and an "
                 f"elapsed time reaching {min(reach, 1.0):.0%} of the budget")
