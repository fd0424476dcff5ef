"""Reading a night: `overnight results` (a sweep's results as a table, results.tsv or JSON, with
its evidence), `overnight status` (one line per sweep), `overnight report` (the morning report as
Markdown or one self-contained HTML file), and the end-of-night summary a foreground run prints.

Registers its commands on `overnight.cli_common.app` when imported (overnight.cli imports it).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from agent.analysis.counts import Counts
from agent.analysis.evidence import recorded_value
from agent.analysis.projection import ExperimentView, LLMSpend
from agent.analysis.report import improvement, results_tsv
from agent.analysis.words import legend
from agent.core.domain import Run, Sweep
from agent.core.errors import NotFoundError
from agent.core.ports import Store
from db.location import DbLocation
from overnight.cli_common import (
    DbOpt,
    app,
    console,
    db_location,
    fail,
    runtime_for,
)


def closing_line(sweep: Sweep, exps: list, runs: list | None = None  # type: ignore[type-arg]
                 ) -> str:
    """One honest sentence: how many changes were tried and kept (agent.analysis.counts), and
    the baseline and the best as the rule records them now, each on its runs."""
    counts = Counts.of_records(exps)
    if sweep.baseline_metric is None or sweep.best_metric is None:
        return f"no baseline metric: {counts.tried} change(s) tried, nothing compared"
    base = next((e for e in exps if e.is_baseline and e.metric is not None), None)
    every = runs or []
    by_time = sweep.config.time_budget if every else True  # runs in one condition or by speed
    base_n = recorded_value(every, base.commit if base else None, by_time)[1] if every else 0
    best_n = recorded_value(every, sweep.best_commit, by_time)[1] if every else 0
    # the baseline as the rule records it now; its value at its verdict too when re-measured
    then = (f", {base.metric:.6f} at its verdict" if base is not None
            and abs(base.metric - sweep.baseline_metric) > 1e-12 else "")
    now = "now, " if then else ""
    baseline = f"baseline {sweep.baseline_metric:.6f}" + (
        f" ({now}on {base_n} run{'s' if base_n != 1 else ''}{then})" if base_n else
        (f" (now{then})" if then else ""))
    if not counts.kept:
        return (f"no change beat the baseline: {sweep.metric} {baseline}; "
                f"{counts.kept_text()}; the branch is unchanged")
    rel = improvement(sweep)
    best = f"best {sweep.best_metric:.6f}" + (f" (on {best_n} run{'s' if best_n != 1 else ''})"
                                              if best_n else "")
    return (f"{counts.kept_text()}: {sweep.metric} {baseline} -> {best}"
            + (f" ({rel:+.2%})" if rel is not None else ""))


def runs_by_status(runs: list[Run]) -> dict[str, dict[str, float]]:
    """How many runs ended in each status and the training seconds they spent (a pruned run's
    up to its stop): where a night's GPU time went."""
    out: dict[str, dict[str, float]] = {}
    for r in runs:
        row = out.setdefault(r.status.value, {"n": 0, "training_s": 0.0})
        row["n"] += 1
        row["training_s"] = round(row["training_s"] + (r.training_s or 0.0), 3)
    return out


def print_results(sweep: Sweep, store, fmt: str,  # type: ignore[no-untyped-def]
                  statement: bool = True) -> None:
    """The sweep's results in `fmt`; a table ends with the evidence's statement unless
    `statement` is False (the demo prints it as its last line)."""
    from agent.analysis.evidence import sweep_evidence
    from agent.analysis.report import evidence_header, evidence_row, sweep_evidence_row
    from overnight.console import results_table

    exps = store.list_experiments(sweep.id)
    runs = store.list_runs(sweep_id=sweep.id)
    ev = sweep_evidence(sweep, exps, runs)
    if fmt in ("tsv", "tsv-full"):
        full = fmt == "tsv-full"
        sys.stdout.write(results_tsv(sweep, exps, ev if full else None, runs if full else None))
    elif fmt == "json":
        by_exp: dict[int, list[Run]] = {}
        for r in runs:
            by_exp.setdefault(r.experiment_id, []).append(r)
        # each `[target] secondary` key's mean over the runs its value rests on, and each
        # run's own value, in the projection as the API gives them (null without a key)
        rows = [{**ExperimentView.of(e, sweep.name, with_conversation=True,
                                     runs=by_exp.get(e.id, []), keys=sweep.config.secondary)
                 .model_dump(mode="json"),
                 **evidence_row(ev.experiments.get(e.id))}
                for e in exps]
        print(
            json.dumps(
                {
                    "sweep": sweep.name,
                    "metric": sweep.metric,
                    "baseline": sweep.baseline_metric,
                    "best": sweep.best_metric,
                    "best_commit": sweep.best_commit,
                    "evidence": sweep_evidence_row(ev),
                    "counts": asdict(Counts.of_records(exps, runs)),
                    "runs_by_status": runs_by_status(runs),
                    "llm": LLMSpend.of(store.llm_usage(sweep.id)).model_dump(),
                    "confirmation": confirmation_json(store, sweep),
                    "experiments": rows,
                },
                indent=2,
            )
        )
    elif fmt == "table":
        console.print(results_table(sweep, exps, evidence=ev, runs=runs))
        console.print(closing_line(sweep, exps, runs))
        console.print(evidence_header(ev, sweep.metric))
        counts = Counts.of_records(exps, runs)
        keys = ("measured", "delta", "incumbent", "p_better", "sigma", "df") \
            + (("set_aside",) if counts.set_aside else ()) + (("reruns",) if counts.reruns else ())
        for line in legend(keys):
            console.print(f"[dim]{escape(line)}[/dim]")
        warned: dict[str, list[int]] = {}
        for e in exps:
            for warning in e.meta.get("warnings", []):
                warned.setdefault(warning, []).append(e.id)
        for warning, ids in warned.items():
            which = ", ".join(f"#{i}" for i in ids[:5]) + (
                f" … ({len(ids)})" if len(ids) > 5 else ""
            )
            console.print(f"[yellow]warning[/yellow] {which}: {escape(warning)}")
        if statement:
            console.print(f"[bold]{escape(ev.statement())}[/bold]")
    else:
        fail(f"--format must be tsv, tsv-full, table or json, got {fmt!r}")


def confirmation_json(store, sweep: Sweep) -> dict | None:  # type: ignore[no-untyped-def,type-arg]
    """The newest finished `overnight confirm` of the sweep, as JSON (None: none)."""
    from dataclasses import asdict

    from agent.ops.confirm import confirmation_of
    from agent.ops.morning import headline_of

    h = headline_of(store, sweep.name)
    found = confirmation_of(store, sweep, (h.improvement, h.improvement_ci, h.baseline))
    return asdict(found) if found is not None else None


def print_summary(sweep: Sweep, store) -> None:  # type: ignore[no-untyped-def]
    """The end-of-night summary: what was learned (the digest), then the results table."""
    from agent.analysis.insights import render
    from agent.analysis.insights_fold import digest

    console.print(escape(render(digest(sweep, store.list_experiments(sweep.id)), 4000)))
    console.print()
    print_results(sweep, store, "table")


@app.command()
def results(
    sweep: Annotated[str | None, typer.Option(help="sweep name")] = None,
    target: Annotated[Path | None, typer.Option(help="latest sweep of this target")] = None,
    format: Annotated[
        str, typer.Option("--format", help="tsv | tsv-full | table | json")
    ] = "table",
    db: DbOpt = None,
) -> None:
    """Print a sweep's results (tsv = autoresearch's results.tsv; tsv-full adds n, sd,
    P(better) and the runs)."""
    store = runtime_for(db).store
    print_results(find_sweep(store, sweep, target, db_location(db)), store, format)


def find_sweep(store: Store, name: str | None, target: Path | None,
               db: DbLocation | None = None) -> Sweep:
    where = f" in {db}" if db else ""
    if name:
        try:
            return store.get_sweep(name)
        except NotFoundError as exc:
            fail(f"{exc}{where}")
    sweeps = store.list_sweeps()
    if target is not None:
        want = str(target.resolve())
        sweeps = [s for s in sweeps if s.target_path == want]
    if not sweeps:
        fail(
            "no sweep found"
            + (f" for target {target}" if target else "")
            + where
            + " (give --sweep NAME or --target PATH, and --db or OVERNIGHT_DB for another database)"
        )
    return sweeps[-1]


STATUS_LATEST = 30  # sweeps `overnight status` shows without --all


@app.command()
def status(
    db: DbOpt = None,
    all_: Annotated[bool, typer.Option(
        "--all", help=f"every sweep (default: the latest {STATUS_LATEST})")] = False,
) -> None:
    """One line per sweep, newest last: status, counts, baseline → best, supported keeps; then
    any experiment tracker left behind."""
    from rich.table import Table

    from agent.analysis.evidence import sweep_evidence

    rt = runtime_for(db)
    store, reads = rt.store, rt.reads
    sweeps = store.list_sweeps()
    shown = sweeps if all_ else sweeps[-STATUS_LATEST:]
    counted = reads.night_counts([s.id for s in shown])  # the maintained counts
    table = Table(title=f"sweeps in {db_location(db)}")
    for col in ("sweep", "status", "changes tried", "kept (baseline aside)", "discarded",
                "crashed", "runs", "baseline", "best", "gain", "supported", "target"):
        table.add_column(col)
    for s in shown:
        n = counted[s.id]
        rel = improvement(s)
        # The light rows the dashboard's evidence reads (no summaries, diffs or logs).
        ev = sweep_evidence(s, reads.experiment_marks(s.id), store.run_metrics(s.id))
        table.add_row(
            s.name,
            s.status.value,
            str(n.tried),
            str(n.kept),
            str(n.discarded),
            str(n.crashed),
            str(n.runs) + (f" ({n.set_aside} set aside)" if n.set_aside else ""),
            f"{s.baseline_metric:.6f}" if s.baseline_metric is not None else "-",
            f"{s.best_metric:.6f}" if s.best_metric is not None else "-",
            f"{rel:+.2%}" if rel is not None else "",
            f"{ev.supported} of {ev.kept} keeps",
            s.target_path,
        )
    console.print(table)
    if len(shown) < len(sweeps):
        console.print(f"{len(sweeps) - len(shown)} older sweep(s) not shown (--all shows them)")
    for s in shown:  # a tracker left behind (agent.ops.track): the lab reads an old night
        for p in reads.track_progress(s.id):
            if not p.up_to_date:
                console.print(f"{s.name}: tracker {p.line()} (overnight export --sweep "
                              f"{s.name} --to {p.destination.split()[0]} back-fills it)",
                              soft_wrap=True, markup=False)


# --- report: the morning report, as Markdown or HTML ------------------------------------------
FORMATS = ("md", "html")


@app.command()
def report(
    sweep: Annotated[str, typer.Option(help="sweep name")],
    format: Annotated[str, typer.Option("--format", help="md | html (one self-contained "
                                        "page, the progress plot inlined)")] = "md",
    output: Annotated[Path | None, typer.Option(help="write it to this file (default: "
                                                "stdout)")] = None,
    db: DbOpt = None,
) -> None:
    """The morning report of a sweep: headline, kept changes with their evidence, what was
    learned, crashes, cost, the attribution of an ablation and what to try next."""
    if format not in FORMATS:
        fail(f"--format must be md or html, got {format!r}")
    store = runtime_for(db).store
    try:
        text = report_text(store, sweep, format)
    except NotFoundError as exc:
        fail(str(exc))
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.expanduser().write_text(text, encoding="utf-8")
    except OSError as exc:
        fail(f"--output {output}: {exc.strerror or exc}")
    console.print(f"report of sweep {sweep} written to {output}", soft_wrap=True)


def report_text(store, sweep: str, fmt: str) -> str:  # type: ignore[no-untyped-def]
    """The report of `sweep` as Markdown or HTML."""
    from agent.analysis.morning_md import render_markdown
    from agent.ops.morning import report_of

    model = report_of(store, sweep)
    if fmt == "html":
        from api.dashboard.report_html import render_html

        return render_html(model)
    return render_markdown(model)
