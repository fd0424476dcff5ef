"""The `overnight` command line (typer): parse, wire, call. No loop logic lives here."""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import signal
import statistics
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from agent.config import CONFIG_FILE, load_config
from agent.domain import Sweep
from agent.errors import INTERRUPT_PREFIX, Interrupted, NotFoundError, OvernightError
from agent.report import experiment_row, improvement, results_tsv
from db.location import DbLocation
from overnight import (  # noqa: F401  (they register their commands)
    cli_adopt,
    cli_agents,
    cli_doctor,
    cli_gc,
    cli_service,
)
from overnight.cli_common import (
    DbOpt,
    DevicesOpt,
    ExecutorOpt,
    RayAddressOpt,
    RayCpusOpt,
    RayGpusOpt,
    RayResourceOpt,
    SlotsOpt,
    WorkDirOpt,
    app,
    console,
    db_location,
    err,
    executor_options,
    executor_slots,
    fail,
    runtime_for,
)
from overnight.runtime import Runtime, open_target

if TYPE_CHECKING:
    from agent.config import TargetConfig
    from agent.gitrepo import GitRepo
    from agent.scheduler import SchedulerSettings

TEMPLATES = Path(__file__).resolve().parent.parent / "experiments"


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="folder for the new target repository")],
    template: Annotated[str, typer.Option(help="template under experiments/")] = "gpt",
) -> None:
    """Create a target repository from a template (a git repo with overnight.toml)."""
    src = TEMPLATES / template
    if not (src / CONFIG_FILE).is_file():
        choices = sorted(p.name for p in TEMPLATES.iterdir() if (p / CONFIG_FILE).is_file())
        fail(f"unknown template {template!r} (available: {', '.join(choices)})")
    init_target(src, path)
    console.print(f"created target [bold]{path}[/bold] from template {template}")
    console.print(f"next: overnight run --target {path} --experiments 20 --budget 300")


def init_target(src: Path, path: Path) -> None:
    from agent.gitrepo import init_repo

    if path.exists() and any(path.iterdir()):
        fail(f"{path} exists and is not empty")
    shutil.copytree(
        src,
        path,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "__init__.py"),
    )
    (path / ".gitignore").write_text("__pycache__/\n*.log\n")
    init_repo(path)


def closing_line(sweep: Sweep, exps: list) -> str:  # type: ignore[type-arg]
    """One honest sentence: how many changes were tried and kept, and what they bought."""
    from agent.domain import ExperimentStatus as S

    tried = [e for e in exps if not e.is_baseline and e.status is not S.REJECTED]
    kept = [e for e in tried if e.status is S.KEPT]
    if sweep.baseline_metric is None or sweep.best_metric is None:
        return f"no baseline metric: {len(tried)} change(s) tried, nothing compared"
    if not kept:
        return (f"no change beat the baseline {sweep.metric} {sweep.baseline_metric:.6f} "
                f"({len(tried)} tried); the branch is unchanged")
    rel = improvement(sweep)
    return (f"{len(kept)} of {len(tried)} change(s) kept: {sweep.metric} "
            f"baseline {sweep.baseline_metric:.6f} -> best {sweep.best_metric:.6f}"
            + (f" ({rel:+.2%})" if rel is not None else ""))


def _print_results(sweep: Sweep, store, fmt: str) -> None:  # type: ignore[no-untyped-def]
    from agent.evidence import sweep_evidence
    from agent.report import evidence_header, evidence_row, sweep_evidence_row
    from overnight.console import results_table

    exps = store.list_experiments(sweep.id)
    ev = sweep_evidence(sweep, exps, store.list_runs(sweep_id=sweep.id))
    if fmt in ("tsv", "tsv-full"):
        sys.stdout.write(results_tsv(sweep, exps, ev if fmt == "tsv-full" else None))
    elif fmt == "json":
        rows = [{**experiment_row(e), **evidence_row(ev.experiments.get(e.id))} for e in exps]
        print(
            json.dumps(
                {
                    "sweep": sweep.name,
                    "metric": sweep.metric,
                    "baseline": sweep.baseline_metric,
                    "best": sweep.best_metric,
                    "best_commit": sweep.best_commit,
                    "evidence": sweep_evidence_row(ev),
                    "experiments": rows,
                },
                indent=2,
            )
        )
    elif fmt == "table":
        console.print(results_table(sweep, exps, evidence=ev))
        console.print(closing_line(sweep, exps))
        console.print(evidence_header(ev, sweep.metric))
        warned: dict[str, list[int]] = {}
        for e in exps:
            for warning in e.meta.get("warnings", []):
                warned.setdefault(warning, []).append(e.id)
        for warning, ids in warned.items():
            which = ", ".join(f"#{i}" for i in ids[:5]) + (
                f" … ({len(ids)})" if len(ids) > 5 else ""
            )
            console.print(f"[yellow]warning[/yellow] {which}: {escape(warning)}")
        console.print(f"[bold]{escape(ev.statement())}[/bold]")
    else:
        fail(f"--format must be tsv, tsv-full, table or json, got {fmt!r}")


def _print_summary(sweep: Sweep, store) -> None:  # type: ignore[no-untyped-def]
    """The end-of-night summary: what was learned (the digest), then the results table."""
    from rich.markup import escape

    from agent.insights import digest, render

    console.print(escape(render(digest(sweep, store.list_experiments(sweep.id)), 4000)))
    console.print()
    _print_results(sweep, store, "table")


def run_foreground(
    db: str | DbLocation | None,
    target: Path,
    *,
    sweep_name: str | None,
    experiments: int,
    budget: float | None,
    proposer: str,
    device: str | None,
    timeout: float | None = None,
    quiet: bool = False,
    resume: bool = False,
    llm_config: Path | None = None,
    slots: int = 1,
    devices: tuple[str, ...] = (),
    allow_dirty: bool = False,
    runs_on: dict[str, Any] | None = None,
    work_dir: Path | None = None,
) -> Sweep:
    """Hold the database's instance lock, recover leftovers, then run one sweep to its end.

    `runs_on`: the executor's SchedulerSettings fields (executor_options)."""
    from agent.scheduler import SchedulerSettings

    rt = runtime_for(db, work_dir)
    rt.hold_lock()
    settings = SchedulerSettings(slots=slots, devices=devices, device=device,
                                 **(runs_on or {}))
    previous = _sigterm_interrupts()
    try:
        return _run_locked(rt, target, sweep_name=sweep_name, experiments=experiments,
                           budget=budget, proposer=proposer, settings=settings,
                           timeout=timeout, quiet=quiet, resume=resume, llm_config=llm_config,
                           allow_dirty=allow_dirty)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        rt.release_lock()


def _sigterm_interrupts() -> Any:
    """SIGTERM stops a foreground run the way Ctrl-C does (recorded, resumable), instead of
    killing the process mid-write. Returns the previous handler (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupt(_signum: int, _frame: Any) -> None:
        raise Interrupted("SIGTERM")

    return signal.signal(signal.SIGTERM, interrupt)


def _interrupted(rt: Runtime, sweep: Sweep, target: Path, exc: KeyboardInterrupt,
                 since: datetime) -> None:
    """Say what a Ctrl-C/SIGTERM did and how to resume; pause the sweep so that a service on
    the same database does not carry on with it. Exits 130 (SIGINT) or 143 (SIGTERM)."""
    from agent.domain import ExperimentStatus, SweepStatus

    store = rt.store
    if store.get_sweep(sweep.name).status is SweepStatus.RUNNING:
        store.set_sweep_status(sweep.name, SweepStatus.PAUSED)
    hit = [e for e in store.list_experiments(sweep.id, [ExperimentStatus.INTERRUPTED])
           if (e.reason or "").startswith(INTERRUPT_PREFIX) and e.finished_at
           and e.finished_at >= since][-1:]
    what = "no run was in flight"
    if hit:
        label = "the baseline" if hit[0].is_baseline else repr(hit[0].description)
        what = (f"experiment {hit[0].id} ({label}) was stopped and recorded `interrupted`; "
                "it runs again on resume")
    name = getattr(exc, "signal_name", "Ctrl-C (SIGINT)")
    command = shlex.join(["overnight", "run", "--target", str(target), "--sweep", sweep.name,
                          "--resume", "--db", str(rt.db)])
    err.print(f"interrupted by {name}: {what}. Sweep {sweep.name} is paused.")
    err.print(f"resume with: {command}", markup=False)
    raise typer.Exit(143 if name == "SIGTERM" else 130)


def _run_locked(
    rt: Runtime, target: Path, *, sweep_name: str | None, experiments: int,
    budget: float | None, proposer: str, settings: SchedulerSettings, timeout: float | None,
    quiet: bool, resume: bool, llm_config: Path | None, allow_dirty: bool = False,
) -> Sweep:
    config = None if resume else load_config(target).with_budget(budget, timeout)
    repo = open_target(target)
    # A foreground run killed earlier leaves rows `running`: interrupt and re-queue them once.
    report = rt.recover()
    if report.interrupted:
        console.print(f"recovered {len(report.interrupted)} interrupted experiment(s); "
                      "each is re-queued once")
    if resume:
        sweep = _resume_sweep(rt, repo, target, sweep_name)
    else:
        assert config is not None
        sweep = _new_sweep(rt, repo, target, config, sweep_name=sweep_name, proposer=proposer,
                           experiments=experiments, allow_dirty=allow_dirty)
    llm_kwargs = ({"config_path": llm_config}
                  if llm_config and sweep.proposer.startswith("llm:") else {})
    _drive(rt, sweep, target, settings, quiet=quiet, proposer_kwargs=llm_kwargs)
    return rt.store.get_sweep(sweep.name)


def _resume_sweep(rt: Runtime, repo: GitRepo, target: Path, sweep_name: str | None) -> Sweep:
    from agent.domain import SweepStatus
    from agent.sweeps import requeue_baseline

    if not sweep_name:
        fail("--resume needs --sweep NAME")
    sweep = rt.store.get_sweep(sweep_name)
    if Path(sweep.target_path) != target.resolve():
        fail(f"sweep {sweep_name} belongs to {sweep.target_path}, not {target}")
    sweep = rt.store.set_sweep_status(sweep_name, SweepStatus.RUNNING)
    console.print(f"resuming sweep [bold]{sweep.name}[/bold] on branch {sweep.branch}")
    if requeue_baseline(rt.store, repo, sweep) is not None:
        console.print("the baseline never finished: it runs again first")
    return sweep


def _new_sweep(rt: Runtime, repo: GitRepo, target: Path, config: TargetConfig, *,
               sweep_name: str | None, proposer: str, experiments: int,
               allow_dirty: bool) -> Sweep:
    from agent.sweeps import create_sweep, default_sweep_name, dirty_files

    name = sweep_name or default_sweep_name(rt.store)
    dirty = dirty_files(repo, config)
    if dirty and allow_dirty:
        console.print(f"[bold red]--allow-dirty: running the committed HEAD; these "
                      f"uncommitted changes are NOT run:[/bold red] {escape(', '.join(dirty))}")
    sweep = create_sweep(rt.store, repo, target, name=name, proposer=proposer, config=config,
                         max_experiments=experiments, allow_dirty=allow_dirty)
    console.print(
        f"sweep [bold]{name}[/bold] on branch {sweep.branch}: baseline + "
        f"{experiments} experiments, budget {config.budget_s:g}s, db {rt.db}"
    )
    return sweep


def _drive(rt: Runtime, sweep: Sweep, target: Path, settings: SchedulerSettings, *,
           quiet: bool, proposer_kwargs: dict[str, Any]) -> None:
    """The one engine in burst mode, with a live view on a terminal, lines otherwise."""
    from agent.domain import utcnow
    from agent.scheduler import SlotScheduler
    from overnight.console import LineLog, LiveView

    view = LiveView(console, sweep) if console.is_terminal else LineLog(console, sweep)
    engine = SlotScheduler(rt.store, settings, rt.loop_factory(
        settings, on_event=None if quiet else view.on_event, proposer_kwargs=proposer_kwargs))
    since = utcnow()
    try:
        if quiet or isinstance(view, LineLog):
            engine.run_burst([sweep.name])
        else:
            with view.live:
                engine.run_burst([sweep.name])
            console.print()  # the live view's last frame ends without a newline off a terminal
    except KeyboardInterrupt as exc:
        _interrupted(rt, sweep, target, exc, since)
        raise


@app.command()
def run(
    target: Annotated[Path, typer.Option(help="target git repository with overnight.toml")],
    experiments: Annotated[int, typer.Option(min=0, help="experiments after the baseline")] = 20,
    budget: Annotated[float | None, typer.Option(help="training seconds per run")] = None,
    sweep: Annotated[str | None, typer.Option(help="sweep name (default: a date tag)")] = None,
    proposer: Annotated[str, typer.Option(help="knobs | llm:<profile>")] = "knobs",
    device: Annotated[str | None, typer.Option(help="OVERNIGHT_DEVICE for the script")] = None,
    slots: SlotsOpt = None,
    devices: DevicesOpt = None,
    executor: ExecutorOpt = "local",
    ray_address: RayAddressOpt = None,
    ray_gpus: RayGpusOpt = 1.0,
    ray_cpus: RayCpusOpt = 1.0,
    ray_resource: RayResourceOpt = None,
    resume: Annotated[bool, typer.Option(help="continue an existing --sweep after a stop")] = False,
    llm_config: Annotated[Path | None, typer.Option(
        help="LLM profiles file (default $OVERNIGHT_LLM_CONFIG or ~/.overnight/llm.toml)")] = None,
    allow_dirty: Annotated[bool, typer.Option(
        help="run the committed HEAD although the checkout has uncommitted changes")] = False,
    db: DbOpt = None,
    work_dir: WorkDirOpt = None,
) -> None:
    """Run a sweep in the foreground: baseline, then one change at a time (one per slot)."""
    runs_on = executor_options(executor, ray_address, ray_gpus, ray_cpus, ray_resource)
    n_slots, found = executor_slots(slots, devices, runs_on)
    done = run_foreground(
        db,
        target,
        sweep_name=sweep,
        experiments=experiments,
        budget=budget,
        proposer=proposer,
        device=device,
        resume=resume,
        llm_config=llm_config,
        slots=n_slots,
        devices=found,
        allow_dirty=allow_dirty,
        runs_on=runs_on,
        work_dir=work_dir,
    )
    # What the baseline got wrong first, so the night's honest statement stays the last line.
    cli_doctor.print_baseline_hints(runtime_for(db, work_dir).store, done)
    _print_summary(done, runtime_for(db, work_dir).store)


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
    _print_results(find_sweep(store, sweep, target, db_location(db)), store, format)


def find_sweep(store, name: str | None, target: Path | None,  # type: ignore[no-untyped-def]
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


@app.command()
def status(db: DbOpt = None) -> None:
    """One line per sweep: status, counts, baseline → best."""
    from rich.table import Table

    from agent.domain import ExperimentStatus as S
    from agent.evidence import sweep_evidence

    store = runtime_for(db).store
    table = Table(title=f"sweeps in {db_location(db)}")
    for col in (
        "sweep",
        "status",
        "runs",
        "kept",
        "discarded",
        "crashed",
        "baseline",
        "best",
        "gain",
        "supported",
        "target",
    ):
        table.add_column(col)
    for s in store.list_sweeps():

        def n(*st: S, sid: int = s.id) -> str:
            return str(store.count_experiments(sid, st))

        rel = improvement(s)
        ev = sweep_evidence(s, store.list_experiments(s.id), store.list_runs(sweep_id=s.id))
        table.add_row(
            s.name,
            s.status.value,
            n(S.KEPT, S.DISCARDED, S.CRASHED, S.TIMEOUT),
            n(S.KEPT),
            n(S.DISCARDED),
            n(S.CRASHED, S.TIMEOUT),
            f"{s.baseline_metric:.4f}" if s.baseline_metric is not None else "-",
            f"{s.best_metric:.4f}" if s.best_metric is not None else "-",
            f"{rel:+.2%}" if rel is not None else "",
            f"{ev.supported} of {ev.kept} keeps",
            s.target_path,
        )
    console.print(table)


@app.command()
def demo(
    budget: Annotated[float, typer.Option(help="training seconds per run")] = 10.0,
    experiments: Annotated[int, typer.Option(min=1, help="experiments after baseline")] = 5,
    dir: Annotated[Path | None, typer.Option("--dir", help="where to make the target")] = None,
    db: DbOpt = None,
) -> None:
    """A real short sweep on CPU: makes a throw-away gpt target, runs baseline + knobs."""
    from agent.sweeps import default_sweep_name

    where = db_location(db)
    store = runtime_for(where).store
    name = default_sweep_name(store, prefix="demo-")
    target = (dir or where.local_home.parent / "demo-targets" / name).expanduser()
    init_target(TEMPLATES / "gpt", target)
    console.print(f"demo target: {target}")
    done = run_foreground(
        where,
        target,
        sweep_name=name,
        experiments=experiments,
        budget=budget,
        proposer="knobs",
        device="cpu",
        timeout=max(budget * 4, budget + 120),
    )
    _print_results(done, store, "table")
    console.print("\n[bold]results.tsv[/bold]")
    _print_results(done, store, "tsv")
    console.print(f"\n[bold]git log {done.branch}[/bold] (baseline + kept only)")
    for sha, subject in open_target(target).log(done.branch, limit=20):
        console.print(f"  {sha} {subject}")
    gaps = _overheads(store, done)
    if gaps:
        console.print(f"\nservice overhead between runs: median {statistics.median(gaps):.3f}s")
    console.print(
        f"\nsee it in the dashboard: {own_command()} serve --db {where}  then open "
        "http://127.0.0.1:8000/", soft_wrap=True,
    )
    from agent.evidence import sweep_evidence

    ev = sweep_evidence(done, store.list_experiments(done.id), store.list_runs(sweep_id=done.id))
    console.print(f"\n[bold]{ev.statement()}[/bold]")


def own_command() -> str:
    """`overnight` when it is on PATH, else the path of this one (e.g. .venv/bin/overnight)."""
    here = Path(sys.executable).parent / "overnight"
    on_path = shutil.which("overnight")
    if on_path and Path(on_path).resolve() == here.resolve():
        return "overnight"
    return str(here) if here.exists() else "overnight"


def _overheads(store, sweep: Sweep) -> list[float]:  # type: ignore[no-untyped-def]
    """Seconds from one run's exit to the next run's start."""
    times = [t for t in store.timestamps(sweep.id) if t[0] and t[1]]
    return [(b[0] - a[1]).total_seconds() for a, b in zip(times, times[1:], strict=False)]


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except OvernightError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)

