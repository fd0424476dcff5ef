"""Admission: `admit` a proposal (every check, or an AdmissionError), then `queue` it.

`admit` = `screen` (the checks that need no git: a one-line description, cleaned once; size,
shape and paths; the duplicate lookup) then `place` (git applies the diff to the sweep head and
its own view of the touched paths is checked). The REST route runs `screen` with its other reads
in one transaction and `place` outside it; the loop calls `admit`. A refusal the loop keeps is
recorded with `reject`. Uses the Store and Repo ports only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from agent.core.domain import Experiment, Proposal, Sweep
from agent.core.errors import AdmissionError, DuplicateError, PatchError
from agent.core.ports import Repo, Store
from agent.rules.admit import check_changes, check_proposal, clean_description
from agent.rules.endings import finish_of, refused


@dataclass(frozen=True)
class Admitted:
    """A proposal that passed every check, its description cleaned, and the head it is for."""

    sweep: Sweep
    proposal: Proposal
    head: str


def screen(store: Store, sweep: Sweep, proposal: Proposal) -> Proposal:
    """The checks that need no git (one index search for a duplicate). Returns the proposal
    with its description cleaned. Raises AdmissionError.

    A proposer that knows its proposal is unusable (a language model that gave no usable
    change) hands it in to be recorded, with `meta["unusable"]` = {code, message}: that is
    the refusal, so the record says what went wrong rather than "the diff is empty"."""
    unusable = proposal.meta.get("unusable")
    if isinstance(unusable, dict):
        raise AdmissionError(str(unusable.get("code") or "unusable"),
                             str(unusable.get("message") or "the proposer marked it unusable"))
    clean = replace(proposal, description=clean_description(proposal.description))
    check_proposal(clean, sweep.config)
    earlier = store.has_diff(sweep.id, clean.diff)
    if earlier is not None:
        raise AdmissionError(
            "duplicate",
            f"the same change was already tried as experiment {earlier.id} "
            f"({earlier.status.value}): {earlier.description}",
        )
    return clean


def place(repo: Repo, sweep: Sweep, screened: Proposal) -> Admitted:
    """The git checks of a screened proposal: it applies to the sweep head, and git's view of
    what it touches is allowed (git is the final authority). Raises AdmissionError."""
    head = repo.head(sweep.branch)
    try:
        changes = repo.tree_changes(head, screened.diff)  # one git process: apply, then read
    except PatchError as exc:
        raise AdmissionError(
            "does_not_apply", f"diff does not apply to the sweep head {head[:7]}: {exc}", 409
        ) from None
    check_changes(changes, sweep.config)
    return Admitted(sweep, screened, head)


def admit(store: Store, repo: Repo, sweep: Sweep, proposal: Proposal) -> Admitted:
    """Every admission check. Raises AdmissionError naming the problem; writes nothing."""
    return place(repo, sweep, screen(store, sweep, proposal))


def queue(store: Store, admitted: Admitted, *, attempt: int = 0, priority: int = 0
          ) -> Experiment:
    """Insert the queued row. The store refuses a second active copy of a change atomically
    (two identical proposals racing past `admit`): that is the same `duplicate` refusal."""
    sweep, proposal = admitted.sweep, admitted.proposal
    try:
        exp = store.add_experiment(sweep.id, proposal, attempt=attempt, priority=priority,
                                   base_commit=admitted.head)
    except DuplicateError:
        earlier = store.has_diff(sweep.id, proposal.diff)
        raise AdmissionError(
            "duplicate",
            "the same change was already tried as experiment "
            + (f"{earlier.id} ({earlier.status.value}): {earlier.description}" if earlier
               else "queued at the same moment"),
        ) from None
    return _record_usage(store, exp)


def reject(store: Store, sweep: Sweep, proposal: Proposal, refusal: AdmissionError, *,
           attempt: int = 0) -> Experiment:
    """Record a refused proposal as `rejected`, its reason kept (what the loop does with its
    own proposer's refusals, so a sweep's history shows every idea)."""
    try:
        description = clean_description(proposal.description)
    except AdmissionError:
        description = proposal.description or "(no description)"
    rejected = replace(proposal, description=description,
                       meta={**proposal.meta, "rejection": refusal.code})
    return _record_usage(store, store.add_experiment(
        sweep.id, rejected, ended=finish_of(refused(refusal.message)), attempt=attempt))


def _record_usage(store: Store, exp: Experiment) -> Experiment:
    """LLM tokens/dollars a proposer spent on this proposal (meta["llm_usage"]) go on the
    experiment's and the sweep's counters (the one record of spend the caps read)."""
    usage = exp.meta.get("llm_usage")
    if isinstance(usage, dict):
        store.add_llm_usage(
            exp.sweep_id,
            exp.id,
            int(usage.get("tokens_in", 0)),
            int(usage.get("tokens_out", 0)),
            float(usage.get("usd", 0.0)),
        )
    return exp
