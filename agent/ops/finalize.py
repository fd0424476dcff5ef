"""`overnight finalize`: a sweep's kept chain as a new branch to merge, one commit per kept change
on top of the baseline, each message carrying its evidence; and, for `--ablate`, the ablation
sweep that measures the best minus each kept change (agent.engine.ablation runs it).

Never moves a branch that exists: the sweep's branch and the user's stay where they are, the new
branch gets a free name. Each replayed commit has its kept commit's exact tree (the diff git
computes between the kept commit and its parent, applied on the replayed parent), so the
branch's tip is the sweep's best; that is checked. Store and git (Repo port plus `diff`) only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.analysis.ablation import ABLATION_PREFIX, BASELINE, BEST, MINUS
from agent.analysis.evidence import ExperimentEvidence, sweep_evidence
from agent.analysis.report import comparison_line
from agent.core.config import TargetConfig
from agent.core.domain import Experiment, ExperimentStatus, Proposal, Sweep
from agent.core.errors import ConflictError, NotFoundError, PatchError
from agent.core.ports import Repo, Store
from agent.ops.sweeps import BRANCH_PREFIX, create_sweep
from agent.rules.endings import finish_of, refused

logger = logging.getLogger(__name__)
FINAL_PREFIX = "overnight-final/"  # finalized branches (not under overnight/: sweeps live there)
MAX_NAME = 64


class ChainRepo(Repo, Protocol):
    def diff(self, old: str, new: str, context: int | None = None) -> str:
        """`git diff old new` (-U`context`)."""


@dataclass(frozen=True)
class Finalized:
    sweep: str
    branch: str
    base: str  # the baseline commit the chain starts on
    commits: tuple[tuple[int, str], ...]  # (kept experiment id, its replayed commit), in order
    diffs: tuple[tuple[int, str], ...]  # (kept experiment id, what it changes), in order
    bare: tuple[tuple[int, str], ...] = ()  # the same without context lines (git diff -U0)

    @property
    def tip(self) -> str:
        return self.commits[-1][1] if self.commits else self.base


def kept_chain(store: Store, sweep: Sweep) -> tuple[Experiment, list[Experiment]]:
    """The sweep's first kept baseline and its kept changes in the order they were kept."""
    exps = store.list_experiments(sweep.id, [ExperimentStatus.KEPT])
    base = next((e for e in exps if e.is_baseline and e.commit), None)
    if base is None:
        raise ConflictError(f"sweep {sweep.name} has no kept baseline: there is nothing to "
                            "finalize")
    return base, [e for e in exps if not e.is_baseline and e.commit]


def finalize(store: Store, repo: ChainRepo, sweep: Sweep) -> Finalized:
    """Replay the kept chain on the baseline as a new branch; returns what was made."""
    base, kept = kept_chain(store, sweep)
    ev = sweep_evidence(sweep, store.list_experiments(sweep.id),
                        store.list_runs(sweep_id=sweep.id))
    head, commits, diffs, bare = base.commit or "", [], [], []
    for e in kept:
        parent = e.base_commit or base.commit or ""
        diff = repo.diff(parent, e.commit or "")
        bare.append((e.id, repo.diff(parent, e.commit or "", context=0)))
        message = commit_message(e, sweep, ev.experiments.get(e.id))
        try:
            head = repo.commit_proposal(head, diff, message)[0]
        except PatchError as exc:  # the recorded chain is not linear: say so, make nothing
            raise ConflictError(f"kept change #{e.id} does not apply on the replayed chain: "
                                f"{exc}") from None
        commits.append((e.id, head))
        diffs.append((e.id, diff))
    if sweep.best_commit and repo.diff(head, sweep.best_commit).strip():
        raise ConflictError(f"the replayed chain of {sweep.name} does not end on its best "
                            f"commit {sweep.best_commit[:7]}; nothing was made")
    branch = free_branch(repo, FINAL_PREFIX + sweep.name)
    repo.ensure_branch(branch, head)  # a new name: nothing existing moves
    logger.info("sweep %s finalized as %s (%d commits)", sweep.name, branch, len(commits))
    return Finalized(sweep.name, branch, base.commit or "", tuple(commits), tuple(diffs),
                     tuple(bare))


def commit_message(e: Experiment, sweep: Sweep, ev: ExperimentEvidence | None) -> str:
    """The kept change's description, then its evidence and where it came from."""
    lines = [e.description.strip().splitlines()[0] if e.description.strip() else
             f"overnight experiment {e.id}", ""]
    if ev is not None and e.metric is not None:
        # its record as every screen shows it: what its runs measured, its difference from the
        # incumbent runs it was compared with (inferred) and P(better)
        p = f"; P(better) {ev.p_better:.2f}" if ev.p_better is not None else ""
        now = ev.remeasured_text(e.metric)
        compared = comparison_line(e, sweep.direction, sweep.config.time_budget)
        lines.append(f"Evidence: {sweep.metric} {compared}{p}" + (f"; {now}" if now else "")
                     + ".")
    if e.reason:
        lines.append(f"Decision: {e.reason}")
    lines += ["", f"Overnight-Sweep: {sweep.name}", f"Overnight-Experiment: {e.id}",
              f"Overnight-Commit: {e.commit}", f"Overnight-Proposer: {e.proposer}"]
    return "\n".join(lines)


def free_branch(repo: Repo, wanted: str) -> str:
    """`wanted`, or `wanted-2`, `wanted-3` … : the first name no branch has."""
    name, k = wanted, 1
    while repo.has_ref(f"refs/heads/{name}"):
        k += 1
        name = f"{wanted}-{k}"
    return name


def free_sweep_name(store: Store, repo: Repo, wanted: str) -> str:
    """`wanted` (cut to a sweep name's length), or with `-2`, `-3` …: the first name that no
    sweep has and whose branch does not exist."""
    stem = wanted[:MAX_NAME - 4]
    name, k = stem, 1
    while True:
        try:
            store.get_sweep(name)
        except NotFoundError:
            if not repo.has_ref(f"refs/heads/{BRANCH_PREFIX}{name}"):
                return name
        k += 1
        name = f"{stem}-{k}"


@dataclass(frozen=True)
class Variant:
    keys: tuple[tuple[str, int | None], ...]  # what it measures (agent.analysis.ablation)
    description: str
    commit: str | None  # None: it could not be built
    why: str = ""  # why not


def variants(repo: ChainRepo, done: Finalized, kept: Sequence[Experiment]) -> list[Variant]:
    """The baseline and the best minus each kept change (the best itself is the ablation
    sweep's baseline). With one kept change, minus it is the baseline."""
    ids = [i for i, _ in done.commits]
    names = {e.id: e.description for e in kept}
    if len(ids) == 1:
        return [Variant(((BASELINE, None), (MINUS, ids[0])), "the baseline (no kept change)",
                        done.base)]
    out = [Variant(((BASELINE, None),), "the baseline (no kept change)", done.base)]
    bare = dict(done.bare)
    for left in ids:
        head, why = done.base, ""
        for i, diff in done.diffs:
            if i == left:
                continue
            try:
                head = _apply(repo, head, diff, bare.get(i), f"ablation: without #{left}")
            except PatchError as exc:
                head, why = "", f"#{i} does not apply without #{left}: {exc}"[:400]
                break
        what = f"the best without #{left}: {names.get(left, '')}"[:200]
        out.append(Variant(((MINUS, left),), what, head or None, why))
    return out


def _apply(repo: ChainRepo, base: str, diff: str, bare: str | None, message: str) -> str:
    """Commit `diff` on `base`; when its context lines name a change left out (a neighbouring
    line), the same change without context (each hunk's own lines must still match)."""
    try:
        return repo.commit_proposal(base, diff, message)[0]
    except PatchError:
        if not bare:
            raise
        return repo.commit_proposal(base, bare, message)[0]


def prepare_ablation(store: Store, repo: ChainRepo, sweep: Sweep, done: Finalized, seeds: int,
                     budget_s: float | None = None) -> Sweep:
    """Create the ablation sweep of `done` (its baseline is the best: the finalized tip) and
    queue its variants, `seeds` runs each; a variant that cannot be built is recorded
    rejected. ConflictError when nothing was kept."""
    if not done.commits:
        raise ConflictError(f"sweep {sweep.name} kept no change: there is nothing to ablate")
    _, kept = kept_chain(store, sweep)
    planned = variants(repo, done, kept)
    config = TargetConfig.from_dict({**sweep.config.with_budget(budget_s).to_dict(),
                                     "baseline_runs": seeds})
    name = free_sweep_name(store, repo, f"{sweep.name}-ablate")
    chain = [i for i, _ in done.commits]
    abl = create_sweep(store, repo, Path(sweep.target_path), name=name,
                       proposer=ABLATION_PREFIX + sweep.name, config=config,
                       max_experiments=len(planned), start=done.tip, allow_dirty=True)
    for v in planned:
        meta = {"ablation": {"of": sweep.name, "keys": [list(k) for k in v.keys],
                             "commit": v.commit, "chain": chain}}
        diff = repo.diff(done.tip, v.commit) if v.commit else ""
        proposal = Proposal(v.description, diff, "ablation", meta=meta)
        if v.commit is None:
            store.add_experiment(abl.id, proposal, ended=finish_of(refused(
                f"cannot be built: {v.why}")), base_commit=done.tip)
            continue
        row = store.add_experiment(abl.id, proposal, base_commit=done.tip)
        repo.set_ref(f"refs/overnight/{abl.name}/{row.id}", v.commit)
    logger.info("ablation sweep %s of %s: %d variants × %d seeds", abl.name, sweep.name,
                len(planned) + 1, seeds)
    return store.get_sweep(abl.name)


BEST_KEY = (BEST, None)  # what the ablation sweep's baseline measures
