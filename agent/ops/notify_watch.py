"""When to notify: a keep, a crash streak, a plateau, a paused sweep and the end of the night,
read off the engine's finished experiments and the sweeps' statuses.

Pure state (no I/O): `Watch.finished` and `Watch.status` take what happened and return the
notices it calls for, each at most once per occurrence (a streak is announced when it reaches its
length, a plateau when it sets in; both again only after a keep or a run that ends them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agent.analysis.ablation import ablated_sweep
from agent.analysis.confirm import confirmed_sweep
from agent.analysis.trials import PLATEAU_AFTER
from agent.core.domain import Experiment, ExperimentStatus, Sweep, SweepStatus

S = ExperimentStatus
KEEP, CRASH_STREAK, PLATEAU, PAUSED, DONE = "keep", "crash_streak", "plateau", "paused", "done"
EVENTS = (KEEP, CRASH_STREAK, PLATEAU, PAUSED, DONE)
CRASH_STREAK_DEFAULT = 3


@dataclass(frozen=True)
class Notice:
    """One thing worth a message: what happened, to which sweep, in a title and a line."""

    event: str
    sweep: str
    title: str
    text: str
    experiment: dict[str, Any] | None = None
    status: str = ""  # the sweep's status when it was noticed


@dataclass
class _State:
    streak: list[Experiment] = field(default_factory=list)  # crashes in a row
    stall: int = 0  # runs since the last keep
    last_keep: int | None = None
    status: SweepStatus | None = None


def _brief(e: Experiment) -> dict[str, Any]:
    return {"id": e.id, "description": e.description, "status": e.status.value,
            "metric": e.metric, "delta": e.delta, "crash_kind":
            e.crash_kind.value if e.crash_kind else None, "crash_cause": e.crash_cause}


class Watch:
    def __init__(self, crash_streak: int = CRASH_STREAK_DEFAULT,
                 plateau_after: int = PLATEAU_AFTER) -> None:
        self.crash_streak, self.plateau_after = crash_streak, plateau_after
        self.sweeps: dict[str, _State] = {}

    def knows(self, name: str) -> bool:
        return name in self.sweeps

    def seed(self, sweep: Sweep, history: Iterable[Experiment]) -> None:
        """Start following `sweep` where its history (finished experiments) left it."""
        state = self.sweeps.setdefault(sweep.name, _State(status=sweep.status))
        for e in history:
            self._count(state, e)

    def finished(self, sweep: Sweep, e: Experiment) -> list[Notice]:
        state = self.sweeps.setdefault(sweep.name, _State(status=sweep.status))
        if ablated_sweep(sweep.proposer) is not None or \
                confirmed_sweep(sweep.proposer) is not None:
            return []  # an ablation measures, keeps nothing: only its end is news
        before_streak, before_stall = len(state.streak), state.stall
        if not self._count(state, e):
            return []
        if e.status is S.KEPT:
            what = f"{sweep.metric} {e.metric:.6g}" if e.metric is not None else "kept"
            delta = f" ({e.delta:+.4g} vs the best before)" if e.delta is not None else ""
            return [Notice(KEEP, sweep.name, f"{sweep.name}: kept #{e.id} {e.description[:80]}",
                           f"{what}{delta}", _brief(e), sweep.status.value)]
        out = []
        if len(state.streak) == self.crash_streak > before_streak:
            causes = ", ".join(f"#{x.id} {x.crash_cause or x.status.value}"
                               for x in state.streak)
            out.append(Notice(CRASH_STREAK, sweep.name,
                              f"{sweep.name}: {self.crash_streak} crashes in a row",
                              causes, _brief(e), sweep.status.value))
        if state.stall == self.plateau_after > before_stall:
            last = f"last keep #{state.last_keep}" if state.last_keep else "nothing kept yet"
            out.append(Notice(PLATEAU, sweep.name, f"{sweep.name}: on a plateau",
                              f"{state.stall} runs without a keep ({last})", _brief(e),
                              sweep.status.value))
        return out

    def _count(self, state: _State, e: Experiment) -> bool:
        """Fold one finished experiment in; False when it says nothing (the baseline, a
        refusal, a cancel)."""
        if e.is_baseline or e.status not in (S.KEPT, S.DISCARDED, S.CRASHED, S.TIMEOUT):
            return False
        if e.status is S.KEPT:
            state.streak, state.stall, state.last_keep = [], 0, e.id
            return True
        state.stall += 1
        state.streak = [*state.streak, e] if e.status in (S.CRASHED, S.TIMEOUT) else []
        return True

    def status(self, sweep: Sweep) -> list[Notice]:
        """A sweep's status as read now: a notice when it just paused or ended."""
        state = self.sweeps.setdefault(sweep.name, _State())
        was, state.status = state.status, sweep.status
        if was is sweep.status or was is None and sweep.status is not SweepStatus.RUNNING:
            return []
        if sweep.status is SweepStatus.PAUSED:
            return [Notice(PAUSED, sweep.name, f"{sweep.name}: paused",
                           "the sweep is paused: the service's log says why; resume it "
                           f"(POST /sweeps/{sweep.name}/resume or overnight run --resume)",
                           status=sweep.status.value)]
        if sweep.status.is_finished():
            return [Notice(DONE, sweep.name, f"{sweep.name}: the night is over "
                           f"({sweep.status.value})", f"overnight report --sweep {sweep.name}",
                           status=sweep.status.value)]
        return []
