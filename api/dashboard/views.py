"""What each dashboard page shows, from the store and its read models (db.reads): plain data.

A sweep page's whole-sweep parts (counts, plot, evidence, digest) come from its experiments'
plot fields and diffs and its runs' metrics (history.py: after a finish it reads only the rows
that changed), kept as running state that a finish adds to (fold.py) and cached under the
sweep's version (SweepCache) so a page view between two finishes derives none of it; the table
is one keyset page (`before`/`after` cursors, PAGE_SIZE rows), the kept stack the latest
KEPT_SHOWN keeps, the live panel the running rows. The overview and experiment pages read
counts and index lookups, not sweeps. No HTML here (templates do).

The cache: the plot, counts, evidence and digest of a sweep read every experiment (the digest
every diff): ~1 s at 10,000 experiments, while the table, kept stack and live panel read a page
each. Those derived parts depend on the sweep's finished work (queued and running rows are not
drawn, and the page reads their counts and times afresh): `Store.sweep_version` changes
whenever an experiment or run finishes, so a value cached under it (and the sweep's best, which
the page also shows) is the value the page would compute now. Entries are keyed weakly by the
store (a store that goes away takes its entries with it).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

from markupsafe import Markup

from agent.analysis.evidence import ExperimentEvidence, SweepEvidence
from agent.analysis.insights import Insights, sections
from agent.analysis.projection import LLMView, reported_memory_gb
from agent.analysis.report import difference_cell, evidence_header, improvement, runs_cell
from agent.analysis.secondary import SecondaryMean, fmt_secondary, run_value, secondary_means
from agent.core.diff import diff_stats, view_lines
from agent.core.domain import Experiment, ExperimentStatus, Run, RunRole, Sweep, utcnow
from agent.ops.service import Service, read_log
from db.reads import Reads
from runner.summary import parse_progress

from .band import band_svg, incumbent_runs
from .fold import RUNS, Rollup, SweepFold, advance, fold_key
from .history import HistoryCache, SweepHistory
from .plot import draw_progress, loss_svg
from .window import TimeWindow

# --- what a sweep page derives from the whole sweep, cached per store under its version -------
T = TypeVar("T")
PER_STORE = 16  # sweeps remembered per store


class SweepCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_store: WeakKeyDictionary[Any, dict[int, tuple[Hashable, Any]]] = (
            WeakKeyDictionary())

    def get(self, store: Any, sweep_id: int, version: Hashable, make: Callable[[], T]) -> T:
        """The value cached for the sweep at `version`, else `make()` (then cached)."""
        hit = self.peek(store, sweep_id, version)
        return hit if hit is not None else self.put(store, sweep_id, version, make())

    def peek(self, store: Any, sweep_id: int, version: Hashable) -> Any | None:
        """The value cached for the sweep at `version`, or None."""
        with self._lock:
            hit = self._by_store.setdefault(store, {}).get(sweep_id)
        return hit[1] if hit is not None and hit[0] == version else None

    def latest(self, store: Any, sweep_id: int) -> tuple[Hashable, Any] | None:
        """(version, value) last cached for the sweep, whatever its version."""
        with self._lock:
            return self._by_store.setdefault(store, {}).get(sweep_id)

    def put(self, store: Any, sweep_id: int, version: Hashable, value: T) -> T:
        with self._lock:
            entries = self._by_store.setdefault(store, {})
            entries.pop(sweep_id, None)
            entries[sweep_id] = (version, value)
            while len(entries) > PER_STORE:
                entries.pop(next(iter(entries)))
        return value


# --- the pages --------------------------------------------------------------------------------
logger = logging.getLogger(__name__)
S = ExperimentStatus
PAGE_SIZE = 50
KEPT_SHOWN = 30  # the kept stack's latest changes; the `kept` filter pages through all
TAIL_LINES = 40
TAIL_BYTES = 64 * 1024
# Status filters offered on the sweep page: label → statuses.
FILTERS: dict[str, tuple[ExperimentStatus, ...]] = {
    "all": (),
    "kept": (S.KEPT,),
    "discarded": (S.DISCARDED,),
    "crashed": (S.CRASHED, S.TIMEOUT),
    "queued": (S.QUEUED, S.RUNNING),
    "other": (S.REJECTED, S.CANCELLED, S.INTERRUPTED),
}


def rollups(reads: Reads, sweeps: Sequence[Sweep]) -> dict[int, Rollup]:
    """Per-sweep counts (the maintained counts) and training time (ended runs summed in the
    database, plus the running ones' time so far): one row per sweep comes back, not one per
    experiment."""
    now = utcnow()
    counted, seconds = reads.status_counts_by_sweep(), reads.run_seconds()
    out = {s.id: Rollup(Counter(counted.get(s.id, {})), seconds.get(s.id, 0.0)) for s in sweeps}
    for e in reads.store.list_experiments(statuses=[S.RUNNING]):
        if e.sweep_id in out and e.run_started_at is not None and e.run_ended_at is None:
            out[e.sweep_id].train_s += max(0.0, (now - e.run_started_at).total_seconds())
    return out


def overview(reads: Reads) -> list[dict[str, Any]]:
    sweeps = reads.store.list_sweeps()
    ups = rollups(reads, sweeps)
    night = reads.night_counts([s.id for s in sweeps])
    return [{"sweep": s, "r": ups[s.id], "night": night[s.id], "improvement": improvement(s)}
            for s in reversed(sweeps)]


# --- sweep page ----------------------------------------------------------------------------
SUMMARIES = SweepCache()
DIGESTS = SweepCache()
HISTORIES = HistoryCache()
EVIDENCE = SweepCache()
FOLDS = SweepCache()  # the latest SweepFold per sweep, under (history version, best)


@dataclass(frozen=True)
class SweepSummary:
    """The parts of a sweep page computed from every experiment and run of the sweep."""

    rollup: Rollup  # the page uses its training time (running rows' time left out)
    evidence: SweepEvidence
    plot: Markup
    insights: list[dict[str, Any]]


def sweep_summary(reads: Reads, sweep: Sweep) -> SweepSummary:
    """The sweep's summary, cached until one of its experiments or runs finishes."""
    experiments, runs = reads.sweep_version(sweep.id)
    best = (sweep.best_metric, sweep.best_commit, sweep.baseline_metric)

    def make() -> SweepSummary:
        # The rows come from the history (it reads what changed since its last read), the
        # parts from its fold (it adds what finished since). The digest is redrawn when an
        # experiment finishes (or the best moves), not when only a run ended; its count of
        # queued and running experiments may lag until then.
        fold = _fold(reads, sweep, HISTORIES.get(reads, sweep.id, (experiments, runs)))
        insights = DIGESTS.get(reads, sweep.id, (experiments, best),
                               lambda: insights_panel_of(fold.insights(sweep)))
        ev = EVIDENCE.get(reads, sweep.id, (experiments, runs, best),
                          partial(fold.sweep_evidence, sweep))
        return SweepSummary(
            rollup=fold.rollup_now(), evidence=ev,
            plot=draw_progress(fold.plot(), sweep.metric, evidence=ev, best=sweep.best_metric),
            insights=insights)

    return SUMMARIES.get(reads, sweep.id, (experiments, runs, best), make)


def _fold(reads: Reads, sweep: Sweep, history: SweepHistory) -> SweepFold:
    """The sweep's fold at `history` (the last one moved on by what finished since)."""
    last = FOLDS.latest(reads, sweep.id)
    if last is not None and last[0] == (history.version, fold_key(sweep)):
        return last[1]  # type: ignore[no-any-return]
    made = advance(last[1] if last is not None else None, sweep, history)
    return FOLDS.put(reads, sweep.id, (history.version, fold_key(sweep)), made)


def runs_with_pairs(reads: Reads, sweep: Sweep, e: Experiment,
                    ev: ExperimentEvidence | None) -> list[Run]:
    """The experiment's runs and the incumbent's runs it was compared with (its record's) or
    that were started beside them, by id."""
    own = reads.store.list_runs(experiment_id=e.id)
    beside = {b for _, b in ev.pairs} if ev is not None else set()
    if e.record is not None and e.record.incumbent is not None:
        beside |= set(e.record.incumbent.runs)
    if not beside:
        return own
    # those runs alone (not every run after them), as whole records (with their units)
    owners = {r.experiment_id for r in reads.store.run_metrics(sweep.id, ids=beside)}
    extra = [r for o in sorted(owners) for r in reads.store.list_runs(experiment_id=o)
             if r.id in beside]
    return sorted([*own, *(r for r in extra if r.id not in {x.id for x in own})],
                  key=lambda r: r.id)


def runs_used(e: Experiment) -> dict[int, str]:
    """What its record did with each run: in its value, set aside, or compared with."""
    record = e.record
    if record is None:
        return {}
    out = {i: "its value" for i in record.change.runs}
    out.update({i: "set aside" for i in record.set_aside})
    if record.incumbent is not None:
        out.update({i: "compared with" for i in record.incumbent.runs})
    return out


def cached_evidence(reads: Reads, sweep: Sweep) -> SweepEvidence:
    """The sweep's evidence as its page shows it, cached under the sweep's version (after a
    finish: the history's few new rows folded in)."""
    experiments, runs = reads.sweep_version(sweep.id)
    version = (experiments, runs, (sweep.best_metric, sweep.best_commit, sweep.baseline_metric))
    hit = EVIDENCE.peek(reads, sweep.id, version)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    fold = _fold(reads, sweep, HISTORIES.get(reads, sweep.id, (experiments, runs)))
    return EVIDENCE.put(reads, sweep.id, version, fold.sweep_evidence(sweep))


def sweep_page(service: Service, reads: Reads, sweep: Sweep, status: str, page: int,
               before: int | None = None, after: int | None = None,
               span: TimeWindow = TimeWindow()) -> dict[str, Any]:
    summary = sweep_summary(reads, sweep)
    running = reads.store.list_experiments(sweep.id, [S.RUNNING])
    # Counts now (the summary only moves when work finishes), finished time from the summary.
    r = replace(summary.rollup, counts=Counter(reads.status_counts(sweep.id)))
    now = utcnow()
    for e in running:  # their time so far, as of now
        r.train_s += max(0.0, (now - e.run_started_at).total_seconds()) if e.run_started_at \
            else 0.0
    ev = summary.evidence
    status = status if status in FILTERS else "all"
    kept = reads.store.list_experiments(sweep.id, [S.KEPT], limit=KEPT_SHOWN, newest_first=True)
    return {
        "sweep": sweep,
        "r": r,
        "improvement": improvement(sweep),
        "evidence": ev,
        "evidence_header": evidence_header(ev, sweep.metric),
        "plot": summary.plot,
        **table_page(reads, sweep, status, page, before, after, ev, span),
        "status": status,
        "span": span,
        "filters": list(FILTERS),
        "kept": [
            {"exp": e, "lines": view_lines(e.diff), "stats": diff_stats(e.diff),
             "ev": ev.experiments.get(e.id), "difference": difference_cell(e),
             "secondary": secondary_of(reads, e, sweep.config.secondary)}
            for e in reversed(kept)
        ],
        "runs_ended": sum(n for _, n, _ in reads.sweep_version(sweep.id)[1]),
        "night": reads.night_counts([sweep.id])[sweep.id],
        "kept_total": r.counts[S.KEPT.value],
        "best_files": best_files(service, sweep),
        "running": [live_run(reads, sweep, e, with_points=False) for e in running],
        "queued": r.counts[S.QUEUED.value],
        "insights": summary.insights,
        "tracking": tracking_lines(reads, sweep),
    }


def tracking_lines(reads: Reads, sweep: Sweep) -> list[tuple[bool, str]]:
    """(up to date, line) per experiment tracker that mirrors the sweep (agent.ops.track); a
    [track] table with nothing mirrored yet says so."""
    lines = [(p.up_to_date, p.line()) for p in reads.track_progress(sweep.id)]
    if not lines and sweep.config.track is not None:
        lines = [(False, f"{sweep.config.track.to}: nothing mirrored yet")]
    return lines


def table_page(reads: Reads, sweep: Sweep, status: str, page: int, before: int | None,
               after: int | None, ev: Any, span: TimeWindow = TimeWindow()) -> dict[str, Any]:
    """One keyset page of the table, newest first, and the pager's cursors. `page` is the
    page's number as the links counted it; without a cursor it is read as "the page-th page"
    (reads page × PAGE_SIZE rows: kept for old links; the pager's links are cursors). In a
    time window the total is not known (counts are kept per status, not per time): None."""
    wanted = list(FILTERS[status]) or None
    total = None if span.active else reads.store.count_experiments(sweep.id, wanted)
    pages = None if total is None else max(1, math.ceil(total / PAGE_SIZE))
    page = max(page, 1) if pages is None else min(max(page, 1), pages)
    listed = partial(reads.store.list_experiments, sweep.id, wanted, since=span.since,
                     until=span.until)
    if after is not None:
        got = listed(after_id=after, limit=PAGE_SIZE + 1)
        newer, older, rows = len(got) > PAGE_SIZE, True, got[:PAGE_SIZE][::-1]
        page = page if newer else 1
    elif before is not None:
        got = listed(before_id=before, newest_first=True, limit=PAGE_SIZE + 1)
        newer, older, rows = True, len(got) > PAGE_SIZE, got[:PAGE_SIZE]
    else:
        got = listed(limit=page * PAGE_SIZE + 1, newest_first=True)
        rows = got[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]
        newer, older = page > 1, len(got) > page * PAGE_SIZE
    keys = sweep.config.secondary  # each row's runs are read only when the target names keys
    return {
        "rows": [table_row(e, ev.experiments.get(e.id), secondary_of(reads, e, keys))
                 for e in rows],
        "secondary_keys": keys,
        "row_count": total,
        "page": page,
        "pages": pages,
        "newer": f"after={rows[0].id}&page={page - 1}" if newer and rows else None,
        "older": f"before={rows[-1].id}&page={page + 1}" if older and rows else None,
    }


def insights_panel_of(found: Insights) -> list[dict[str, Any]]:
    return [{"heading": h, "lines": [x.removeprefix("- ") for x in lines]}
            for h, lines in sections(found) if lines]


def secondary_of(reads: Reads, e: Experiment, keys: Sequence[str],
                 runs: Sequence[Run] | None = None) -> tuple[SecondaryMean, ...]:
    """Each `[target] secondary` key's mean over the runs the experiment's value rests on
    (agent.analysis.secondary); its runs read from the store unless given; () without keys."""
    if not keys:
        return ()
    return secondary_means(e.record, reads.store.list_runs(experiment_id=e.id)
                           if runs is None else runs, keys)


def table_row(e: Experiment, ev: ExperimentEvidence | None = None,
              secondary: tuple[SecondaryMean, ...] = ()) -> dict[str, Any]:
    secs = e.summary.get("training_seconds")
    return {
        "exp": e,
        "ev": ev,
        "secondary": secondary,
        "runs": runs_cell(e, ev),
        "difference": difference_cell(e),
        "memory_gb": reported_memory_gb(e),
        "train_s": secs if isinstance(secs, int | float) else None,
    }


def best_files(service: Service, sweep: Sweep) -> list[dict[str, str]]:
    """The editable file(s) at the best commit; empty if the target repo is gone."""
    if not sweep.best_commit:
        return []
    from agent.git.repo import GitError

    try:
        _, files = service.best_files(sweep, sweep.best_commit)
    except GitError as exc:
        logger.warning("best file of %s unavailable: %s", sweep.name, exc)
        return []
    return [{"path": p, "text": text} for p, text in files.items()]


def best_file(service: Service, sweep: Sweep, path: str) -> str | None:
    for f in best_files(service, sweep):
        if f["path"] == path:
            return f["text"]
    return None


# --- live run ------------------------------------------------------------------------------
def log_text(e: Experiment, sealed: str | None = None) -> str:
    """The log file's end if it is readable, else the tail recorded at finish (the holdout
    metric `sealed`)."""
    return read_log(e, max_bytes=TAIL_BYTES, sealed=sealed)


def tail(text: str, n: int = TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-n:])


def live_run(reads: Reads, sweep: Sweep, e: Experiment, with_points: bool = True) -> dict[str, Any]:
    """A running (or just finished) experiment as JSON-ready data for the live panel."""
    text = log_text(e, sweep.config.holdout_metric)
    progress = list(reads.loss_points(e.id)) if with_points else []
    if not progress:  # loss points reach the DB every few seconds; the log is fresher
        progress = [p for p in map(parse_progress, text.splitlines()) if p is not None]
    points = [(p.step, p.loss) for p in progress]
    # Training time is what the script reports (its clock starts after start-up/compile);
    # the wall time since spawn includes start-up, so only training is held against the budget.
    trained = [p.elapsed_s for p in progress if p.elapsed_s is not None]
    started = e.run_started_at or e.started_at
    end = e.run_ended_at or (None if e.status is S.RUNNING else e.finished_at) or utcnow()
    elapsed = (end - started).total_seconds() if started else 0.0
    training_s = round(trained[-1], 1) if trained else 0.0
    # the bar: training seconds of a time budget, steps of a budget of steps; none for tokens,
    # which no progress line counts
    steps = sweep.config.budget_steps
    done, of, unit = ((training_s, sweep.budget_s, "s") if sweep.config.time_budget else
                      (points[-1][0] if points else 0, steps, "steps") if steps else
                      (None, None, "tokens"))
    return {
        "id": e.id,
        "href": f"/ui/experiments/{e.id}",
        "description": e.description,
        "status": e.status.value,
        "finished": e.status.is_finished(),
        "elapsed_s": round(max(elapsed, 0.0), 1),
        "training_s": training_s,
        "budget_s": sweep.budget_s,
        "done": done, "of": of, "unit": unit, "budget": sweep.config.budget_text,
        "timeout_s": sweep.timeout_s,
        "last_loss": points[-1][1] if points else None,
        "loss_svg": str(loss_svg(points)),
        "log": tail(text),
        "slurm_job_id": slurm_job(reads, e),
    }


def slurm_job(reads: Reads, e: Experiment) -> str | None:
    """The Slurm job of a running experiment's latest run (executor slurm), else None."""
    if e.status is not S.RUNNING:
        return None
    jobs = [r.slurm_job_id for r in reads.store.list_runs(experiment_id=e.id) if r.slurm_job_id]
    return jobs[-1] if jobs else None


# --- experiment page -----------------------------------------------------------------------
def experiment_page(reads: Reads, e: Experiment) -> dict[str, Any]:
    """One experiment with its neighbours, parent, retries and run number (index lookups) and
    its evidence from the sweep's cached evidence (a page view reads no other experiment)."""
    sweep = reads.store.get_sweep_by_id(e.sweep_id)
    points = [(p.step, p.loss) for p in reads.loss_points(e.id)]
    text = log_text(e, sweep.config.holdout_metric)
    if not points:
        parsed = (parse_progress(line) for line in text.splitlines())
        points = [(p.step, p.loss) for p in parsed if p is not None]
    prev, next_ = reads.adjacent_experiments(sweep.id, e.id)
    parent = reads.store.get_experiment(e.parent_id) if e.parent_id is not None else None
    ev = cached_evidence(reads, sweep).experiments.get(e.id)
    own = runs_with_pairs(reads, sweep, e, ev)
    # the summary and the log tail of one run, named: the run whose log the experiment keeps
    shown = next((r for r in reversed(own) if r.experiment_id == e.id and e.log_path
                  and r.log_path == e.log_path and r.role is not RunRole.INCUMBENT), None)
    summary = shown.summary if shown is not None and shown.summary else e.summary
    keys = sweep.config.secondary
    return {
        # each secondary key's mean over the runs its value rests on, and each run's own value
        "secondary": secondary_of(reads, e, keys, own),
        "run_secondary": {r.id: [fmt_secondary(run_value(r.summary, k)) for k in keys]
                          for r in own},
        "sweep": sweep,
        "exp": e,
        "ev": ev,
        "runs": own,
        "used": runs_used(e),
        "difference": difference_cell(e),
        "warnings": e.meta.get("warnings", []),
        "lines": view_lines(e.diff),
        "stats": diff_stats(e.diff),
        "summary": sorted(summary.items()),
        "shown_run": shown.id if shown is not None else None,
        "loss": loss_svg(points, width=640, height=200),
        "against": band_svg([r for r in own if r.experiment_id == e.id
                             and r.role is not RunRole.INCUMBENT],
                            incumbent_runs(reads, sweep, e),
                            policy=sweep.config.early_stop_policy(),
                            judged=sweep.config.prune == "auto"),
        "log": tail(text, 200),
        "has_log_file": bool(e.log_path and Path(e.log_path).is_file()),
        "parent": parent if parent is not None and parent.sweep_id == sweep.id else None,
        "retries": [x for x in reads.retries_of(e.id) if x.sweep_id == sweep.id],
        "prev": prev,
        "next": next_,
        "run_no": reads.run_number(sweep.id, e.id) if e.status in RUNS else None,
        "live": live_run(reads, sweep, e) if e.status is S.RUNNING else None,
        "llm": LLMView.of(e.meta),
    }
