"""Rich terminal output for the CLI: the live run panel and result tables."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from agent.analysis.evidence import ExperimentEvidence, SweepEvidence
from agent.analysis.projection import reported_memory_gb
from agent.analysis.report import (
    comparison_line,
    difference_cell,
    fmt_metric,
    runs_cell,
    shown_status,
)
from agent.analysis.secondary import by_experiment, secondary_means
from agent.analysis.words import why_not_kept
from agent.core.domain import Experiment, ExperimentStatus, Run, Sweep
from agent.core.record import Ending

STYLE = {
    ExperimentStatus.KEPT: "green",
    ExperimentStatus.DISCARDED: "grey50",
    ExperimentStatus.CRASHED: "red",
    ExperimentStatus.TIMEOUT: "magenta",
    ExperimentStatus.REJECTED: "yellow",
    ExperimentStatus.CANCELLED: "yellow",
    ExperimentStatus.INTERRUPTED: "yellow",
}


def results_table(
    sweep: Sweep,
    experiments: list[Experiment],
    title: str | None = None,
    evidence: SweepEvidence | None = None,
    runs: Sequence[Run] | None = None,
) -> Table:
    """One row per experiment: its value (the mean of the runs its record names: measured) and
    those runs, its difference from the incumbent runs it was compared with ± se (inferred) and
    P(better); a kept commit measured again since says its value now. With the sweep's `runs`,
    each `[target] secondary` key's mean over the same runs (measured; agent.analysis.secondary)
    in a column of its own."""
    table = Table(title=title or f"sweep {sweep.name} ({sweep.metric}, {sweep.direction.value})")
    keys = sweep.config.secondary if runs is not None else ()
    secondary = by_experiment(experiments, runs or (), keys)
    cols = ["#", "commit", "status", f"{sweep.metric} (measured)", "runs",
            "Δ vs its incumbent runs (inferred)", "P(better)",
            *(f"{key} (measured)" for key in keys), "mem GB", "train s", "description"]
    for col in cols:
        table.add_column(col, overflow="fold")
    for exp in experiments:
        ev = evidence.experiments.get(exp.id) if evidence is not None else None
        secs = exp.summary.get("training_seconds")
        table.add_row(
            str(exp.id),
            (exp.commit or "")[:7],
            Text(shown_status(exp), style=STYLE.get(exp.status, "")),
            fmt_metric(exp.metric),
            runs_cell(exp, ev),
            difference_cell(exp),
            f"{ev.p_better:.2f}" if ev is not None and ev.p_better is not None else "",
            *(m.text for m in secondary.get(exp.id, ())),
            "" if (gb := reported_memory_gb(exp)) is None else f"{gb:.1f}",
            f"{secs:.1f}" if isinstance(secs, float) else "",
            Text(describe(exp, ev)),  # plain text: a reason in brackets is not rich markup
        )
    return table


def describe(exp: Experiment, ev: ExperimentEvidence | None = None) -> str:
    """The description, with the reason of an experiment that was not simply kept or judged
    not better (a crash, a failed or stopped run, a machine that would not hold still), and
    a kept commit's value now when it was measured again since ("kept at …; now …")."""
    record = exp.record
    plain = record is not None and record.ending in (Ending.KEPT, Ending.NOT_BETTER,
                                                     Ending.BASELINE)
    now = ev.remeasured_text(exp.metric, "measured" if exp.is_baseline else "kept") \
        if ev is not None else ""
    return (exp.description + (f"  [{exp.reason}]" if exp.reason and not plain else "")
            + (f"  [{now}]" if now else ""))


RunsOf = Callable[[int], Sequence[Run]]  # an experiment's runs by its id (the store's)


def secondary_text(sweep: Sweep, exp: Experiment, runs_of: RunsOf | None) -> str:
    """Each `[target] secondary` key's mean over the runs the experiment's value rests on
    (agent.analysis.secondary), "peak_vram_mb 812.4  tokens_per_s 15813"; "" without keys."""
    keys = sweep.config.secondary
    if not keys or runs_of is None:
        return ""
    return "  ".join(f"{m.key} {m.text}" for m in secondary_means(exp.record, runs_of(exp.id),
                                                                    keys))


class LineLog:
    """Off a terminal (piped, logged): one plain line per finished experiment, as it happens:
    what its runs measured and how it compared, each reference named; with `runs_of` and a
    target that names `[target] secondary` keys, each key's mean over the same runs."""

    def __init__(self, console: Console, sweep: Sweep, runs_of: RunsOf | None = None) -> None:
        self.console, self.sweep, self.runs_of = console, sweep, runs_of

    def on_event(self, kind: str, exp: Experiment, data: dict[str, Any]) -> None:
        if kind != "finished":
            return
        secs = exp.summary.get("training_seconds")
        trained = f"train {secs:.1f}s" if isinstance(secs, float) else ""
        compared = comparison_line(exp, self.sweep.direction, self.sweep.config.time_budget)
        plain = why_not_kept(exp.record)
        extra = secondary_text(self.sweep, exp, self.runs_of)
        line = (f"#{exp.id} {shown_status(exp):<9} {self.sweep.metric} {compared or '-'}  "
                f"{trained}  " + (f"{extra}  " if extra else "") + describe(exp)
                + (f"  [{plain}]" if plain else ""))
        self.console.print(Text(" ".join(line.split(" ")).rstrip()), soft_wrap=True)
        self.console.file.flush()


class LiveView:
    """Current run (elapsed vs budget, or steps on a budget of steps; last loss) above the last
    finished experiments; with `runs_of` and `[target] secondary` keys, each key's mean over
    the runs each one's value rests on (their runs read once, as it finishes)."""

    def __init__(self, console: Console, sweep: Sweep, runs_of: RunsOf | None = None) -> None:
        self.console, self.sweep = console, sweep
        self.runs_of = runs_of if sweep.config.secondary else None
        self.runs: dict[int, Sequence[Run]] = {}  # a finished experiment's runs, by its id
        self.finished: list[Experiment] = []
        self.current: Experiment | None = None
        self.started = 0.0
        self.steps = sweep.config.budget_steps
        self.budget = float(self.steps) if self.steps else sweep.budget_s
        self.last_loss: float | None = None
        self.trained_s: float | None = None
        self.step = 0
        self.live = Live(
            self.render(),
            console=console,
            refresh_per_second=4,
            transient=False,
            get_renderable=self.render,
        )

    def render(self) -> Group:
        parts: list[Any] = []
        if self.finished:
            recent = self.finished[-12:]
            runs = [r for e in recent for r in self.runs.get(e.id, ())] \
                if self.runs_of is not None else None
            parts.append(results_table(self.sweep, recent, title="recent", runs=runs))
        if self.current is not None:
            wall = time.monotonic() - self.started
            loss = f"{self.last_loss:.4f}" if self.last_loss is not None else "-"
            # The budget counts training only: compare it with the script's own elapsed time
            # (from its progress lines); wall time includes start-up and evaluation.
            trained = self.trained_s
            clock = (f"training {trained:5.1f}s / budget {self.budget:g}s (wall {wall:.1f}s)"
                     if trained is not None else
                     f"wall {wall:5.1f}s incl. start-up (budget {self.budget:g}s of training)")
            if self.steps:
                clock = f"step {self.step} / {self.steps} (wall {wall:.1f}s)"
            parts.append(
                Text(f"running #{self.current.id}: {self.current.description}  {clock}  "
                     f"loss {loss}")
            )
            done = float(self.step) if self.steps else trained if trained is not None else 0.0
            parts.append(
                ProgressBar(total=self.budget, completed=min(done, self.budget), width=60)
            )
        return Group(*parts)

    def on_event(self, kind: str, exp: Experiment, data: dict[str, Any]) -> None:
        if kind == "started":
            self.current, self.started, self.last_loss = exp, time.monotonic(), None
            self.trained_s, self.step = None, 0
        elif kind == "line" and data.get("point") is not None:
            self.last_loss = data["point"].loss
            self.trained_s, self.step = data["point"].elapsed_s, data["point"].step
        elif kind == "finished":
            if self.runs_of is not None:  # read here, on the engine's thread, not each frame
                self.runs = {**self.runs, exp.id: self.runs_of(exp.id)}
            self.finished.append(exp)
            shown = {e.id for e in self.finished[-12:]}  # the runs of the rows shown only
            self.runs = {i: r for i, r in self.runs.items() if i in shown}
            if self.current is not None and self.current.id == exp.id:
                self.current = None
