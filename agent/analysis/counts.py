"""A night's counts, each defined once: the console, `overnight status`, the results, the morning
report, the dashboard and the demo all read them from here.

Pure: the domain only. Built from experiments by status (the store's maintained counts, or a
list) and runs by status.

- **changes tried**: the experiments other than the baseline that ran to a verdict (kept,
  discarded, crashed, timed out). Refused, cancelled and interrupted ones are not tried.
- **kept**: changes kept; the baseline, always kept once it ran, is not counted (and screens say
  so where they show both).
- **runs**: training runs of any role (the baseline's, the changes', the incumbent's re-runs).
- **set aside**: runs in no value, because they ran at another machine speed (status
  `suspect`).
- **re-runs**: runs of a kept commit after its verdict (role `incumbent`, beside a change or
  on the schedule).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.core.domain import RAN_STATUSES, Experiment, ExperimentStatus, Run, RunRole, RunStatus

S = ExperimentStatus


@dataclass(frozen=True)
class Counts:
    tried: int  # changes that ran to a verdict
    kept: int  # changes kept (the baseline aside)
    discarded: int
    crashed: int  # changes that crashed or timed out
    refused: int  # rejected before running
    runs: int = 0  # training runs of any role
    set_aside: int = 0  # runs in no value (another machine speed)
    reruns: int = 0  # runs of kept commits after their verdict
    # the baseline's status: its latest row's (an interrupted one is queued again; None: none)
    baseline: ExperimentStatus | None = None

    @classmethod
    def of(cls, by_status: Mapping[str, int], baseline: ExperimentStatus | None,
           runs: Mapping[str, int] | None = None, reruns: int = 0) -> Counts:
        """From experiments by status (the baseline's row included, as the store counts
        them), the baseline's status, and runs by status."""
        def changes(*statuses: ExperimentStatus) -> int:
            return sum(by_status.get(s.value, 0) for s in statuses) - (baseline in statuses)

        runs = runs or {}
        return cls(
            tried=changes(*RAN_STATUSES), kept=changes(S.KEPT), discarded=changes(S.DISCARDED),
            crashed=changes(S.CRASHED, S.TIMEOUT), refused=changes(S.REJECTED),
            runs=sum(n for s, n in runs.items() if s != RunStatus.RUNNING.value),
            set_aside=runs.get(RunStatus.SUSPECT.value, 0), reruns=reruns, baseline=baseline)

    @classmethod
    def of_records(cls, experiments: Iterable[Experiment], runs: Iterable[Run] = ()) -> Counts:
        """From the records themselves (a report, a list of experiments and runs)."""
        exps = list(experiments)
        every = list(runs)
        last = next((e for e in reversed(exps) if e.is_baseline), None)
        return cls.of(Counter(e.status.value for e in exps), last.status if last else None,
                      Counter(r.status.value for r in every),
                      sum(r.role is RunRole.INCUMBENT and r.metric is not None for r in every))

    def kept_text(self) -> str:
        """"2 of 9 changes kept (the baseline aside)"."""
        return (f"{self.kept} of {self.tried} change{'s' if self.tried != 1 else ''} kept"
                + (" (the baseline aside)" if self.baseline is S.KEPT else ""))
