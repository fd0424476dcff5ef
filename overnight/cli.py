"""The `overnight` command line (typer): parse, wire, call. No loop logic lives here."""

from __future__ import annotations

import logging
import shutil
import statistics
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from agent.core.config import CONFIG_FILE, load_config
from agent.core.domain import Sweep
from agent.core.errors import OvernightError
from db.reads import Reads
from overnight import (  # noqa: F401  (they register their commands)
    cli_adopt,
    cli_agents,
    cli_confirm,
    cli_doctor,
    cli_gc,
    cli_report,
    cli_results,
    cli_service,
    cli_track,
    notifications,
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
    SlurmAccountOpt,
    SlurmGpusOpt,
    SlurmGresOpt,
    SlurmOptionOpt,
    SlurmPartitionOpt,
    SlurmQosOpt,
    WorkDirOpt,
    app,
    console,
    db_location,
    err,
    executor_options,
    executor_slots,
    fail,
    own_command,
    runtime_for,
    slurm_options,
    token_command,
)
from overnight.cli_foreground import run_foreground
from overnight.cli_results import print_results, print_summary
from overnight.notifications import NotifyConfigOpt, NotifyOpt
from overnight.runtime import open_target

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
    from agent.git.repo import init_repo

    if path.exists() and any(path.iterdir()):
        fail(f"{path} exists and is not empty")
    shutil.copytree(
        src,
        path,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "__init__.py"),
    )
    (path / ".gitignore").write_text("__pycache__/\n*.log\n.overnight/\n")
    init_repo(path)


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
    slurm_partition: SlurmPartitionOpt = None,
    slurm_account: SlurmAccountOpt = None,
    slurm_qos: SlurmQosOpt = None,
    slurm_gpus: SlurmGpusOpt = 1,
    slurm_gres: SlurmGresOpt = None,
    slurm_option: SlurmOptionOpt = None,
    resume: Annotated[bool, typer.Option(help="continue an existing --sweep after a stop")] = False,
    llm_config: Annotated[Path | None, typer.Option(
        help="LLM profiles file (default $OVERNIGHT_LLM_CONFIG or ~/.overnight/llm.toml)")] = None,
    allow_dirty: Annotated[bool, typer.Option(
        help="run the committed HEAD although the checkout has uncommitted changes")] = False,
    notify: NotifyOpt = None,
    notify_config: NotifyConfigOpt = None,
    track: cli_track.TrackOpt = None,
    confirm_at: Annotated[str | None, typer.Option(
        help="at the end of the night, " + cli_confirm.AT_HELP)] = None,
    confirm_seeds: cli_confirm.SeedsOpt = cli_confirm.CONFIRM_SEEDS,
    db: DbOpt = None,
    work_dir: WorkDirOpt = None,
) -> None:
    """Run a sweep in the foreground: baseline, then one change at a time (one per slot)."""
    at = cli_confirm.check_confirm_at(confirm_at, target)
    runs_on = executor_options(executor, ray_address, ray_gpus, ray_cpus, ray_resource,
                               slurm_options(slurm_partition, slurm_account, slurm_qos,
                                             slurm_gpus, slurm_gres, slurm_option))
    n_slots, found = executor_slots(slots, devices, runs_on)
    notifying = notifications.notify_config(notify, notify_config)
    notifications.announce(notifying, console)
    tracking = cli_track.track_choice(track)
    where = cli_track.ready(tracking, None if resume else load_config(target).track)
    if where is not None:
        console.print(f"mirroring the night to {where}", soft_wrap=True, markup=False)
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
        notify=notifying,
        track=tracking,
    )
    cli_track.print_progress(runtime_for(db, work_dir).reads, done)
    # What the baseline got wrong first, so the night's honest statement stays the last line.
    cli_doctor.print_baseline_hints(runtime_for(db, work_dir).reads, done)
    print_summary(done, runtime_for(db, work_dir).store)
    if at is not None:
        if cli_confirm.has_gain(runtime_for(db, work_dir).store, done):
            cli_confirm.confirm_sweep(db, work_dir, done.name, at, confirm_seeds, slots,
                                      devices)
        else:
            console.print(f"--confirm-at {at.text()}: nothing was kept, nothing to confirm")


@app.command()
def demo(
    budget: Annotated[float, typer.Option(help="training seconds per run")] = 6.0,
    experiments: Annotated[int, typer.Option(min=1, help="experiments after baseline")] = 4,
    dir: Annotated[Path | None, typer.Option("--dir", help="where to make the target")] = None,
    db: DbOpt = None,
) -> None:
    """A real short sweep on CPU: makes a throw-away gpt target, runs baseline + knobs."""
    from agent.ops.sweeps import default_sweep_name

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
    print_results(done, store, "table", statement=False)
    console.print("\n[bold]results.tsv[/bold]")
    print_results(done, store, "tsv")
    console.print(f"\n[bold]git log {done.branch}[/bold] (baseline + kept only)")
    for sha, subject in open_target(target).log(done.branch, limit=20):
        console.print(f"  {sha} {subject}")
    gaps = _overheads(runtime_for(where).reads, done)
    if gaps:
        console.print(f"\nservice overhead between runs: median {statistics.median(gaps):.3f}s")
    console.print(
        f"\nsee it in the dashboard: {own_command()} serve --db {where}  then open "
        f"http://127.0.0.1:8000/ and sign in with the token that {token_command(where)} "
        "prints", soft_wrap=True,
    )
    from agent.analysis.evidence import sweep_evidence

    ev = sweep_evidence(done, store.list_experiments(done.id), store.list_runs(sweep_id=done.id))
    console.print(f"\n{demo_legend(done, budget, ev.load_shifts)}", soft_wrap=True)
    console.print(f"\n[bold]{ev.statement()}[/bold]")


def demo_legend(sweep: Sweep, budget: float, shifts: int) -> str:
    """The one line that says what the demo's numbers mean."""
    load = (f"; {shifts} experiment(s) met another machine speed and were compared beside the "
            "incumbent in the same conditions" if shifts else "")
    return (f"What the numbers mean: {sweep.metric} is bits per byte of held-out text (lower is "
            f"better) after {budget:g} s of CPU training; a change is kept only when a t-test "
            "against the incumbent's runs, on σ̂ (the run-to-run noise of seed and machine), "
            f"passes the night's level, which holds false keeps to {sweep.config.fdr:.0%} of "
            f"all keeps{load}.")


def _overheads(reads: Reads, sweep: Sweep) -> list[float]:
    """Seconds from one run's exit to the next run's start."""
    times = [(a, b) for a, b in reads.timestamps(sweep.id) if a and b]
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

