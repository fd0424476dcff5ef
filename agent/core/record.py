"""The record of how an experiment ended: every number its verdict rested on, each one either
measured (a mean of named runs) or inferred (the keep rule's estimate), written once with the
experiment (meta["verdict"]) and read, never worked out again, by every screen.

Pure: the stdlib and agent.core.bounds only. The keep rule (agent.rules.decide) fills it; the
store writes it with the experiment's end; agent.analysis and the screens read it through
`VerdictRecord.of(meta)`.

- `Measured`: runs that each printed the metric, by id, and their mean. What a screen shows as a
  change's value is always one of these, with its n.
- `VerdictRecord.difference` ± `se`: the change less the incumbent runs it was compared with,
  within machine conditions (docs/keep-rule.md#the-model): an estimate, shown as one.
- `best`: the best as the rule recorded it at that moment (the best commit's runs in its usual
  condition), so a comparison names its reference even after the best is re-measured.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.core.bounds import BoundCheck

RECORD_KEY = "verdict"  # where a finished experiment's meta keeps its record
_LEGACY_TEST_KEY, _LEGACY_STOPPED_KEY = "test", "stopped"  # records written before the record
RECORD_KEYS = (RECORD_KEY, _LEGACY_TEST_KEY, _LEGACY_STOPPED_KEY)  # what a light row keeps


class Ending(str, enum.Enum):
    """How an experiment ended, as the rule (or the lifecycle) decided: what a screen says
    instead of reading its reason's words."""

    BASELINE = "baseline"  # kept: the first incumbent, measured
    KEPT = "kept"  # kept: better by the test (or on one run, the noise unmeasured)
    NOT_BETTER = "not better"  # discarded on its runs
    NOT_JUDGED = "not judged"  # discarded: the machine's speed kept changing around its runs
    STOPPED_EARLY = "stopped early"  # discarded: its run was clearly behind part-way
    OVER_BOUND = "over a bound"  # discarded: past a hard bound of [target.constraints]
    NO_COMPARISON = "no comparison"  # discarded: no incumbent run to compare it with
    REQUEUED = "requeued"  # discarded here: the branch moved; the diff is queued on the new head
    CONFLICT = "conflict"  # discarded: it conflicts with a change kept meanwhile
    RUN_FAILED = "run failed"  # a later run of it failed (a change is discarded)
    CRASHED = "crashed"  # its first run crashed (classified trivial or fundamental)
    TIMEOUT = "timeout"  # killed at the hard limit
    TAMPERED = "tampered"  # its run changed a protected file
    GAVE_UP = "gave up"  # its run was cut off each time the service died: the crash cap
    MEASURED = "measured"  # an ablation or confirmation variant: its runs' mean, no test
    REFUSED = "refused"  # never ran: its diff no longer applies, or a protected file changed
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"  # the service, its worker or the disk went under it; run again
    SHUT_DOWN = "shut down"  # interrupted on purpose (a shutdown, Ctrl-C, SIGTERM); run again
    NOT_STARTED = "not started"  # the executor could not start its run; run again after the fix


JUDGED = frozenset({Ending.KEPT, Ending.NOT_BETTER})  # endings the test (or strict) decided


@dataclass(frozen=True)
class Measured:
    """A mean of runs that each measured the metric (never an estimate), with their ids."""

    runs: tuple[int, ...] = ()  # run ids, in start order (0: not recorded)
    values: tuple[float, ...] = ()
    commit: str | None = None  # the commit they ran, when it matters (the incumbent, the best)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return sum(self.values) / len(self.values) if self.values else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"runs": list(self.runs), "values": list(self.values),
                               "mean": self.mean, "n": self.n}
        if self.commit:
            out["commit"] = self.commit
        return out

    @classmethod
    def of(cls, data: object) -> Measured | None:
        if not isinstance(data, Mapping):
            return None
        values = tuple(float(v) for v in data.get("values") or () if _number(v))
        runs = tuple(int(r) for r in data.get("runs") or () if _number(r))
        commit = data.get("commit")
        return cls(runs, values, commit if isinstance(commit, str) else None)


def measured(pairs: Sequence[tuple[int, float]], commit: str | None = None) -> Measured:
    """Measured from (run id, value) pairs."""
    return Measured(tuple(i for i, _ in pairs), tuple(v for _, v in pairs), commit)


@dataclass(frozen=True)
class StopPoint:
    """Where an early stop ended a change's run: the run, the share of its budget, the step."""

    run: int
    fraction: float | None = None
    step: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run": self.run}
        if self.fraction is not None:
            out["fraction"] = self.fraction
        if self.step is not None:
            out["step"] = self.step
        return out

    @classmethod
    def of(cls, data: object) -> StopPoint | None:
        if not isinstance(data, Mapping) or not _number(data.get("run")):
            return None
        fraction, step = _float(data.get("fraction")), _float(data.get("step"))
        return cls(int(data["run"]), fraction, int(step) if step is not None else None)

    def text(self) -> str:
        """"stopped early at 30 % of the budget (step 120)"."""
        at = (f" at {round(self.fraction * 100)} % of the budget"
              if self.fraction is not None else "")
        return f"stopped early{at}" + (f" (step {self.step})" if self.step is not None else "")


@dataclass(frozen=True)
class VerdictRecord:
    """Everything an experiment's verdict decided on, as written with its end."""

    ending: Ending
    change: Measured = field(default_factory=Measured)  # its runs its value rests on
    set_aside: tuple[int, ...] = ()  # its runs left out (another machine speed), by id
    incumbent: Measured | None = None  # the incumbent runs it was compared with
    best: Measured | None = None  # the best at that moment, as the rule recorded it
    difference: float | None = None  # inferred: change − incumbent within conditions
    se: float | None = None  # the difference's standard error (on σ̂)
    sigma: float | None = None  # σ̂, the run-to-run noise, at the decision
    df: int = 0  # σ̂'s degrees of freedom (0: none measured)
    p: float | None = None  # the look's p over its share: the night's FDR ledger's
    level: float | None = None  # the night's level α_t: kept when p ≤ it
    p_better: float | None = None  # P(T ≤ gain / se): the confidence that it is better
    stopped: StopPoint | None = None  # an early stop: where its run ended
    beside: bool = False  # each incumbent run compared with ran beside one of its runs
    # per machine condition it was compared in: (its runs there, the incumbent's there); the
    # difference is their means' differences averaged with weights 1/(1/n_change + 1/n_inc)
    blocks: tuple[tuple[Measured, Measured], ...] = ()
    # what the test asked the gain to exceed (min_delta, plus the soft bounds' costs, less the
    # simplicity margin for a change that removes lines); None: min_delta alone, or no test
    margin: float | None = None
    lines: int | None = None  # net lines the change adds to the editable files (<0: removes)
    bounds: tuple[BoundCheck, ...] = ()  # [target.constraints] as checked on its runs

    @property
    def simpler(self) -> bool:
        """Kept or judged as a simplification: it removes lines and was tested on the
        simplicity margin (not worse by more than it)."""
        return self.lines is not None and self.lines < 0 and self.margin is not None \
            and self.margin < 0

    @property
    def n(self) -> int:
        """The change's runs its value rests on."""
        return self.change.n

    @property
    def conditions(self) -> tuple[tuple[Measured, Measured], ...]:
        """The blocks it was compared in (one: its runs against the incumbent runs)."""
        if self.blocks:
            return self.blocks
        return ((self.change, self.incumbent),) if self.incumbent is not None else ()

    @property
    def tested(self) -> bool:
        """Decided by the sequential test (it has a p-value), not on one unmeasured run."""
        return self.p is not None

    def gain(self, minimize: bool) -> float | None:
        """The difference as better = positive."""
        if self.difference is None:
            return None
        return -self.difference if minimize else self.difference

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ending": self.ending.value, "change": self.change.to_json()}
        if self.set_aside:
            out["set_aside"] = list(self.set_aside)
        for name in ("incumbent", "best", "stopped"):
            part = getattr(self, name)
            if part is not None:
                out[name] = part.to_json()
        for name in ("difference", "se", "sigma", "p", "level", "p_better"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.df:
            out["df"] = self.df
        if self.beside:
            out["beside"] = True
        if len(self.blocks) > 1:  # one block is `change` and `incumbent` themselves
            out["blocks"] = [{"change": c.to_json(), "incumbent": i.to_json()}
                             for c, i in self.blocks]
        if self.margin is not None:
            out["margin"] = self.margin
        if self.lines is not None:
            out["lines"] = self.lines
        if self.bounds:
            out["bounds"] = [b.to_json() for b in self.bounds]
        return out

    @classmethod
    def of(cls, meta: Mapping[str, Any] | None) -> VerdictRecord | None:
        """The record in an experiment's meta; a partial one from the fields written before
        the record existed ("test", "stopped"); None when it has neither."""
        meta = meta or {}
        data = meta.get(RECORD_KEY)
        if isinstance(data, Mapping):
            try:
                ending = Ending(data.get("ending"))
            except ValueError:
                return None
            return cls(
                ending, Measured.of(data.get("change")) or Measured(),
                tuple(int(r) for r in data.get("set_aside") or () if _number(r)),
                Measured.of(data.get("incumbent")), Measured.of(data.get("best")),
                difference=_float(data.get("difference")), se=_float(data.get("se")),
                sigma=_float(data.get("sigma")),
                df=int(data["df"]) if _number(data.get("df")) else 0,
                p=_float(data.get("p")), level=_float(data.get("level")),
                p_better=_float(data.get("p_better")), stopped=StopPoint.of(data.get("stopped")),
                beside=data.get("beside") is True, blocks=_blocks(data.get("blocks")),
                margin=_float(data.get("margin")),
                lines=int(data["lines"]) if _number(data.get("lines")) else None,
                bounds=tuple(b for b in map(BoundCheck.of, data.get("bounds") or ())
                             if b is not None))
        return _legacy(meta)


def _blocks(data: object) -> tuple[tuple[Measured, Measured], ...]:
    if not isinstance(data, list):
        return ()
    out = []
    for b in data:
        change = Measured.of(b.get("change")) if isinstance(b, Mapping) else None
        incumbent = Measured.of(b.get("incumbent")) if isinstance(b, Mapping) else None
        if change is not None and incumbent is not None:
            out.append((change, incumbent))
    return tuple(out)


def _legacy(meta: Mapping[str, Any]) -> VerdictRecord | None:
    test, stop = meta.get(_LEGACY_TEST_KEY), StopPoint.of(meta.get(_LEGACY_STOPPED_KEY))
    if not isinstance(test, Mapping) and stop is None:
        return None
    test = test if isinstance(test, Mapping) else {}
    ending = Ending.STOPPED_EARLY if stop is not None else (
        Ending.KEPT if test.get("p") is not None and _float(test.get("level")) is not None
        and float(test["p"]) <= float(test["level"]) else Ending.NOT_BETTER)
    return VerdictRecord(ending, sigma=_float(test.get("sigma")),
                         df=int(test["df"]) if _number(test.get("df")) else 0,
                         p=_float(test.get("p")), level=_float(test.get("level")),
                         p_better=_float(test.get("p_better")), stopped=stop)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _float(value: object) -> float | None:
    return float(value) if _number(value) else None  # type: ignore[arg-type]
