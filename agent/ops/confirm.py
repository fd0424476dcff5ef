"""`overnight confirm` (and `overnight run --confirm-at`): the confirmation sweep that re-runs a
night's baseline and best at a larger setting, k seeds each, and its verdict read back.

The confirmation sweep's baseline is the best (recorded kept, as an ablation's is) and its one
variant the night's baseline; agent.engine.ablation's loop runs both on the slots. A larger
budget is the sweep's config; a size knob is the same one-line change (`NAME = VALUE` in an
editable file) committed on the baseline and on the best; a device is the runs' OVERNIGHT_DEVICE
(the caller's scheduler settings). Bad input raises before anything is made. Store and git only.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from agent.analysis.confirm import (
    CONFIRM_PREFIX,
    ConfirmAt,
    Confirmation,
    confirm,
    confirmed_sweep,
)
from agent.core.config import TargetConfig
from agent.core.diff import make_diff
from agent.core.domain import Proposal, RunStatus, Sweep, SweepStatus
from agent.core.errors import ConfigError, ConflictError, OvernightError
from agent.core.ports import Repo, Store
from agent.ops.finalize import ChainRepo, free_sweep_name, kept_chain
from agent.ops.sweeps import create_sweep

logger = logging.getLogger(__name__)
BASELINE_VARIANT = "the night's baseline"


@dataclass(frozen=True)
class KnobLine:
    path: str
    line: int  # 0-based
    text: str


def find_knob(repo: Repo, commit: str, config: TargetConfig, name: str) -> KnobLine:
    """The one module-level `NAME = <number>` line of the editable files at `commit`;
    ConfigError when there is none or more than one."""
    pattern = re.compile(rf"^{re.escape(name)}\s*(?::\s*[A-Za-z_.]+\s*)?=\s*([-+0-9.eE_]+)"
                         r"\s*(#.*)?$")
    found: list[KnobLine] = []
    for path in config.editable:
        try:
            text = repo.read_file(commit, path)
        except (OvernightError, RuntimeError):  # not a file at this commit (git's error)
            continue
        found += [KnobLine(path, i, line) for i, line in enumerate(text.split("\n"))
                  if pattern.match(line)]
    if not found:
        raise ConfigError(f"--confirm-at: the training script has no size knob {name} (a line "
                          f"`{name} = <number>` in {', '.join(config.editable)} at "
                          f"{commit[:7]})")
    if len(found) > 1:
        where = ", ".join(f"{k.path}:{k.line + 1}" for k in found)
        raise ConfigError(f"--confirm-at: {name} is set more than once ({where}); set it once")
    return found[0]


def with_knob(repo: Repo, commit: str, config: TargetConfig, at: ConfirmAt) -> str:
    """`commit` with the knob's line set to the value (one new commit), or `commit` itself
    when it already has that value."""
    assert at.knob is not None
    knob = find_knob(repo, commit, config, at.knob)
    old = repo.read_file(commit, knob.path)
    lines = old.split("\n")
    value = re.sub(r"=\s*[-+0-9.eE_]+", f"= {at.value}", knob.text, count=1)
    if value == knob.text:
        return commit
    lines[knob.line] = value
    diff = make_diff(knob.path, old, "\n".join(lines))
    return repo.commit_proposal(commit, diff, f"confirm at {at.text()}")[0]


def prepare_confirm(store: Store, repo: ChainRepo, sweep: Sweep, at: ConfirmAt,
                    seeds: int) -> Sweep:
    """Create the confirmation sweep of `sweep` at `at` and queue its variant. ConflictError
    when nothing was kept, ConfigError for a setting the target cannot take; either way
    nothing is made."""
    if seeds < 2:
        raise ConfigError(f"--seeds: a confirmation needs at least 2 runs each, got {seeds}")
    base, kept = kept_chain(store, sweep)
    if not kept or not sweep.best_commit or sweep.best_commit == base.commit:
        raise ConflictError(f"sweep {sweep.name} kept no change: there is no gain to confirm")
    config = TargetConfig.from_dict({**sweep.config.with_budget(at.budget).to_dict(),
                                     "baseline_runs": seeds})
    best, baseline = sweep.best_commit, base.commit or ""
    if at.knob is not None:  # both checked before either is committed
        find_knob(repo, best, config, at.knob)
        find_knob(repo, baseline, config, at.knob)
        best, baseline = (with_knob(repo, best, config, at),
                          with_knob(repo, baseline, config, at))
    name = free_sweep_name(store, repo, f"{sweep.name}-confirm")
    conf = create_sweep(store, repo, Path(sweep.target_path), name=name,
                        proposer=CONFIRM_PREFIX + sweep.name, config=config, max_experiments=1,
                        start=best, allow_dirty=True)
    meta = {"confirm": {"of": sweep.name, "at": at.text(), "commit": baseline,
                        "best": best}}
    diff = repo.diff(best, baseline)
    row = store.add_experiment(conf.id, Proposal(BASELINE_VARIANT, diff, "confirm", meta=meta),
                               base_commit=best)
    repo.set_ref(f"refs/overnight/{conf.name}/{row.id}", baseline)
    logger.info("confirmation sweep %s of %s at %s: 2 × %d runs", conf.name, sweep.name,
                at.text(), seeds)
    return store.get_sweep(conf.name)


def night_device(store: Store, sweep: Sweep) -> str | None:
    """The device the night's runs recorded most (None: none recorded): a confirmation at a
    larger budget or size runs where the night ran."""
    devices = Counter(r.device for r in store.list_runs(sweep_id=sweep.id) if r.device)
    return devices.most_common(1)[0][0] if devices else None


def confirmations_of(store: Store, sweep: Sweep) -> list[Sweep]:
    """The confirmation sweeps of `sweep`, oldest first."""
    return [s for s in store.list_sweeps() if confirmed_sweep(s.proposer) == sweep.name]


def confirmation_of(store: Store, sweep: Sweep,
                    night: tuple[float | None, float | None, float | None]
                    ) -> Confirmation | None:
    """The verdict of the newest finished confirmation of `sweep` (None: none finished).
    `night`: the night's (gain, its 95 % half-width, its baseline's mean)."""
    done = [s for s in confirmations_of(store, sweep) if s.status is SweepStatus.DONE]
    if not done:
        return None
    conf = done[-1]
    exps = store.list_experiments(conf.id)
    baseline_ids = {e.id for e in exps if not e.is_baseline and "confirm" in e.meta}
    at = next((str(e.meta["confirm"].get("at", "")) for e in exps if e.id in baseline_ids), "")
    runs = store.list_runs(sweep_id=conf.id)
    good = [r for r in runs if r.status is RunStatus.OK and r.metric is not None]
    base = [r.metric for r in good if r.experiment_id in baseline_ids and r.metric is not None]
    best = [r.metric for r in good if r.experiment_id not in baseline_ids
            and r.metric is not None]
    return confirm(conf.name, at, sweep.direction, base, best, night,
                   conf.config.baseline_runs, len(runs))
