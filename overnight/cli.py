"""The `overnight` command line (typer): parse, wire, call. No loop logic lives here.

The entry point (`main`), and the commands that run experiments in the foreground: `run` and
`demo` (a night), `confirm` (the baseline and the best again at a larger setting) and `finalize`
(the kept chain as a branch; with --ablate, the leave-one-out runs). A foreground run holds the
database's instance lock, recovers leftovers, creates or resumes the sweep, drives the engine in
burst mode with a live view, and turns Ctrl-C/SIGTERM into a recorded, resumable stop.

`confirm` is its own command (not a `finalize` flag): a confirmation needs no new branch, can
be asked again at another setting the next day, and `run --confirm-at` ends a night with it.
The other commands live in one module per area (cli_setup, cli_results, cli_service,
cli_track, cli_gc), each registering on `overnight.cli_common.app` when imported here.
"""

from __future__ import annotations

import logging
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from typer.models import CommandInfo

from agent.analysis.ablation import DEFAULT_SEEDS as ABLATION_SEEDS
from agent.analysis.confirm import DEFAULT_SEEDS as CONFIRM_SEEDS
from agent.core.budget import ComputeBudget, parse_budget
from agent.core.config import load_config
from agent.core.domain import Proposal, Sweep
from agent.core.errors import Interrupted, OvernightError
from agent.engine.interrupts import raise_when_safe
from agent.ops.track import OFF
from db.location import DbLocation
from overnight import (  # noqa: F401  (they register their commands)
    cli_gc,
    cli_results,
    cli_service,
    cli_setup,
    cli_track,
)
from overnight.cli_common import (
    DbOpt,
    DevicesOpt,
    ExecutorOpt,
    NotifyConfigOpt,
    NotifyOpt,
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
    announce,
    app,
    console,
    db_location,
    err,
    executor_options,
    executor_slots,
    fail,
    notify_targets,
    own_command,
    runtime_for,
    slots_and_devices,
    slurm_options,
    token_command,
)
from overnight.cli_results import find_sweep, print_results, print_summary
from overnight.cli_setup import TEMPLATES, init_target
from overnight.runtime import Runtime, hear_all, make_notifier, open_target

if TYPE_CHECKING:
    from agent.analysis.confirm import ConfirmAt
    from agent.core.config import TargetConfig
    from agent.core.ports import Store
    from agent.engine.attempt import EventFn
    from agent.engine.scheduler import SchedulerSettings
    from agent.git.repo import GitRepo
    from agent.ops.notify import Notifier, NotifyConfig
    from agent.ops.track import Choice

AT_HELP = ("the larger setting: budget=SECONDS (or a compute budget, \"budget=2000 steps\"), "
           "device=NAME (OVERNIGHT_DEVICE) or a size knob NAME=VALUE (the same one-line change "
           "to the baseline and to the best)")
SeedsOpt = Annotated[int, typer.Option(min=2, max=20, help="runs of the baseline and of the "
                                       "best each, seeds seed … seed+k−1")]



# --- run and demo: a night in the foreground --------------------------------------------------
@app.command()
def run(
    target: Annotated[Path, typer.Option(help="target git repository with overnight.toml")],
    experiments: Annotated[int, typer.Option(min=0, help="experiments after the baseline")] = 20,
    budget: Annotated[str | None, typer.Option(
        help="training seconds per run, or a compute budget: \"600 steps\", \"2M tokens\"")
    ] = None,
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
        help="at the end of the night, " + AT_HELP)] = None,
    confirm_seeds: SeedsOpt = CONFIRM_SEEDS,
    db: DbOpt = None,
    work_dir: WorkDirOpt = None,
) -> None:
    """Run a sweep in the foreground: baseline, then one change at a time (one per slot)."""
    at = check_confirm_at(confirm_at, target)
    runs_on = executor_options(executor, ray_address, ray_gpus, ray_cpus, ray_resource,
                               slurm_options(slurm_partition, slurm_account, slurm_qos,
                                             slurm_gpus, slurm_gres, slurm_option))
    n_slots, found = executor_slots(slots, devices, runs_on)
    notifying = notify_targets(notify, notify_config)
    announce(notifying, console)
    tracking = cli_track.track_choice(track)
    where = cli_track.ready(tracking, None if resume else load_config(target).track)
    if where is not None:
        console.print(f"mirroring the night to {where}", soft_wrap=True, markup=False)
    done = run_foreground(
        db,
        target,
        sweep_name=sweep,
        experiments=experiments,
        budget=budget_option(budget),
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
    cli_setup.print_baseline_hints(runtime_for(db, work_dir).reads, done)
    print_summary(done, runtime_for(db, work_dir).store)
    if at is not None:
        if has_gain(runtime_for(db, work_dir).store, done):
            confirm_sweep(db, work_dir, done.name, at, confirm_seeds, slots,
                                      devices)
        else:
            console.print(f"--confirm-at {at.text()}: nothing was kept, nothing to confirm")


@app.command()
def demo(
    budget: Annotated[str | None, typer.Option(help="training seconds per run, or a compute "
                                               "budget such as \"20 steps\" (default: by "
                                               "the machine's load)")] = None,
    experiments: Annotated[int, typer.Option(min=1, help="experiments after baseline")] = 4,
    dir: Annotated[Path | None, typer.Option("--dir", help="where to make the target")] = None,
    db: DbOpt = None,
) -> None:
    """A real short sweep on CPU: makes a throw-away gpt target, runs baseline + knobs."""
    from agent.analysis.evidence import sweep_evidence
    from agent.ops.sweeps import default_sweep_name
    from overnight import demo as screen

    plan = screen.demo_plan(budget, experiments)
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
        budget=plan.budget,
        proposer="knobs",
        device="cpu",
        timeout=plan.timeout_s,
        runs_on={"extra_env": screen.run_env(plan)},
        proposals=screen.proposals(plan, target),
    )
    print_results(done, store, "table", statement=False)
    console.print("\n[bold]results.tsv[/bold]")
    print_results(done, store, "tsv")
    console.print(f"\n[bold]git log {done.branch}[/bold] (baseline + kept only)")
    for sha, subject in open_target(target).log(done.branch, limit=20):
        console.print(f"  {sha} {subject}")
    console.print(
        f"\nsee it in the dashboard: {own_command()} serve --db {where}  then open "
        f"http://127.0.0.1:8000/ and sign in with the token that {token_command(where)} "
        "prints", soft_wrap=True,
    )
    exps = store.list_experiments(done.id)
    ev = sweep_evidence(done, exps, store.list_runs(sweep_id=done.id))
    screen.print_end(runtime_for(where).reads, done, exps, target, ev.load_shifts)


def budget_option(text: str | None) -> float | ComputeBudget | None:
    """--budget: seconds (300) or a compute budget ("600 steps"); a bad one exits naming it."""
    try:
        return None if text is None else parse_budget(text)
    except ValueError as exc:
        fail(f"--budget: {exc}")


# --- the foreground run: the lock, the engine, a resumable stop -------------------------------
def run_foreground(
    db: str | DbLocation | None,
    target: Path,
    *,
    sweep_name: str | None,
    experiments: int,
    budget: float | ComputeBudget | None,
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
    notify: NotifyConfig | None = None,
    track: Choice = None,
    proposals: Sequence[Proposal] = (),
) -> Sweep:
    """Hold the database's instance lock, recover leftovers, then run one sweep to its end.

    `runs_on`: the executor's SchedulerSettings fields (executor_options). `notify`: where
    notifications go (none by default). `track`: the --track choice (by default the sweep's
    own [track] table, if any, names its tracker). `proposals`: queued on a new sweep, after
    its baseline, before its proposer's own."""
    from agent.engine.scheduler import SchedulerSettings

    rt = runtime_for(db, work_dir)
    rt.hold_lock()
    settings = SchedulerSettings(slots=slots, devices=devices, device=device,
                                 **(runs_on or {}))
    notifier = make_notifier(rt.store, notify) if notify is not None else None
    previous = interrupt_handlers()
    try:
        return _run_locked(rt, target, sweep_name=sweep_name, experiments=experiments,
                           budget=budget, proposer=proposer, settings=settings,
                           timeout=timeout, quiet=quiet, resume=resume, llm_config=llm_config,
                           allow_dirty=allow_dirty, notifier=notifier, track=track,
                           proposals=proposals)
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: not installed from Python; nothing to put back
                signal.signal(signum, handler)
        if notifier is not None:  # the end of the night (or its pause), delivered briefly
            notifier.close()
        rt.close_mirror()  # the last experiments and the sweep's end, briefly
        rt.release_lock()


def interrupt_handlers() -> dict[int, Any]:
    """Ctrl-C (SIGINT) and SIGTERM stop a foreground run (recorded, resumable), raised between
    store transactions rather than inside one (agent.engine.interrupts); SIGTERM no longer kills the
    process mid-write. Returns the previous handlers (none off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def on_int(_signum: int, _frame: Any) -> None:
        raise_when_safe(KeyboardInterrupt())

    def on_term(_signum: int, _frame: Any) -> None:
        raise_when_safe(Interrupted("SIGTERM"))

    return {signal.SIGINT: signal.signal(signal.SIGINT, on_int),
            signal.SIGTERM: signal.signal(signal.SIGTERM, on_term)}


def _interrupted(rt: Runtime, sweep: Sweep, target: Path, exc: KeyboardInterrupt,
                 since: datetime) -> None:
    """Say what a Ctrl-C/SIGTERM did and how to resume; pause the sweep so that a service on
    the same database does not carry on with it. Exits 130 (SIGINT) or 143 (SIGTERM)."""
    from agent.core.domain import ExperimentStatus, SweepStatus
    from agent.rules.endings import on_purpose

    store = rt.store
    if store.get_sweep(sweep.name).status is SweepStatus.RUNNING:
        store.set_sweep_status(sweep.name, SweepStatus.PAUSED)
    hit = [e for e in store.list_experiments(sweep.id, [ExperimentStatus.INTERRUPTED])
           if on_purpose(e.record) and e.finished_at and e.finished_at >= since][-1:]
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
    budget: float | ComputeBudget | None, proposer: str, settings: SchedulerSettings,
    timeout: float | None, quiet: bool, resume: bool, llm_config: Path | None,
    allow_dirty: bool = False, notifier: Notifier | None = None, track: Choice = None,
    proposals: Sequence[Proposal] = (),
) -> Sweep:
    config = None if resume else load_config(target).with_budget(budget, timeout)
    repo = open_target(target)
    # A foreground run killed earlier leaves rows `running`: interrupt and re-queue them once.
    report = rt.recover(settings)
    if report.interrupted:
        console.print(f"recovered {len(report.interrupted)} interrupted experiment(s); "
                      "each is re-queued once")
    if resume:
        sweep = _resume_sweep(rt, repo, target, sweep_name)
    else:
        assert config is not None
        sweep = _new_sweep(rt, repo, target, config, sweep_name=sweep_name, proposer=proposer,
                           experiments=experiments, allow_dirty=allow_dirty)
        for proposal in proposals:
            rt.service.queue(sweep.name, proposal)
    llm_kwargs = ({"config_path": llm_config}
                  if llm_config and sweep.proposer.startswith("llm:") else {})
    mirror = None
    if track != OFF and (track is not None or sweep.config.track is not None):
        mirror = rt.start_mirror(track)
    _drive(rt, sweep, target, settings, quiet=quiet, proposer_kwargs=llm_kwargs,
           also=hear_all(notifier.on_event if notifier is not None else None,
                         mirror.on_event if mirror is not None else None))
    return rt.store.get_sweep(sweep.name)


def _resume_sweep(rt: Runtime, repo: GitRepo, target: Path, sweep_name: str | None) -> Sweep:
    from agent.core.domain import SweepStatus
    from agent.engine.recovery import RecoveryReport, repair_branch
    from agent.ops.sweeps import requeue_baseline

    if not sweep_name:
        fail("--resume needs --sweep NAME")
    sweep = rt.store.get_sweep(sweep_name)
    if Path(sweep.target_path) != target.resolve():
        fail(f"sweep {sweep_name} belongs to {sweep.target_path}, not {target}")
    was = sweep.status
    sweep = rt.store.set_sweep_status(sweep_name, SweepStatus.RUNNING)
    console.print(f"resuming sweep [bold]{sweep.name}[/bold] on branch {sweep.branch}")
    if was is SweepStatus.DONE:  # recovery left its branch to its owner; it is ours again
        report = RecoveryReport()
        repair_branch(repo, sweep, report)
        for old, best in report.repaired_branches.values():
            console.print(f"branch {sweep.branch} was at {old[:7] or '(missing)'}: reset to "
                          f"the sweep's best {best[:7]} (the old head stays in git's reflog)")
    if requeue_baseline(rt.store, repo, sweep) is not None:
        console.print("the baseline never finished: it runs again first")
    return sweep


def _new_sweep(rt: Runtime, repo: GitRepo, target: Path, config: TargetConfig, *,
               sweep_name: str | None, proposer: str, experiments: int,
               allow_dirty: bool) -> Sweep:
    from agent.ops.sweeps import create_sweep, default_sweep_name, dirty_files

    name = sweep_name or default_sweep_name(rt.store)
    dirty = dirty_files(repo, config)
    if dirty and allow_dirty:
        console.print(f"[bold red]--allow-dirty: running the committed HEAD; these "
                      f"uncommitted changes are NOT run:[/bold red] {escape(', '.join(dirty))}")
    sweep = create_sweep(rt.store, repo, target, name=name, proposer=proposer, config=config,
                         max_experiments=experiments, allow_dirty=allow_dirty)
    console.print(
        f"sweep [bold]{name}[/bold] on branch {sweep.branch}: baseline + "
        f"{experiments} experiments, budget {config.budget_text}, db {rt.db}"
    )
    return sweep


def drive_locked(rt: Runtime, sweep: Sweep, settings: SchedulerSettings) -> Sweep:
    """Run an existing sweep to its end in the foreground (the caller holds the lock and has
    recovered): Ctrl-C/SIGTERM stop it, recorded and resumable. `overnight finalize --ablate`."""
    previous = interrupt_handlers()
    try:
        _drive(rt, sweep, Path(sweep.target_path), settings, quiet=False, proposer_kwargs={})
    finally:
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)
    return rt.store.get_sweep(sweep.name)


def _drive(rt: Runtime, sweep: Sweep, target: Path, settings: SchedulerSettings, *,
           quiet: bool, proposer_kwargs: dict[str, Any], also: EventFn | None = None) -> None:
    """The one engine in burst mode, with a live view on a terminal, lines otherwise; `also`
    hears the engine's events too (the notifications)."""
    from agent.core.domain import utcnow
    from agent.engine.scheduler import SlotScheduler
    from overnight.console import LineLog, LiveView

    def runs_of(experiment_id: int) -> list[Any]:  # the `[target] secondary` keys' runs
        return rt.store.list_runs(experiment_id=experiment_id)

    view = (LiveView(console, sweep, runs_of) if console.is_terminal
            else LineLog(console, sweep, runs_of))
    hear = [f for f in (None if quiet else view.on_event, also) if f is not None]

    def on_event(kind: str, exp: Any, data: dict[str, Any]) -> None:
        for f in hear:
            f(kind, exp, data)

    engine = SlotScheduler(rt.store, settings, rt.loop_factory(
        settings, on_event=on_event if hear else None, proposer_kwargs=proposer_kwargs),
        disk_space=rt.disk_space)
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
    _stop_if_not_started(rt, sweep, target, since)


def _stop_if_not_started(rt: Runtime, sweep: Sweep, target: Path, since: datetime) -> None:
    """A run the executor could not start (a refused job, no node or GPU for it) paused the
    sweep: say so in the executor's one sentence, with the fix, and end with exit status 2
    (RunNotStartedError) instead of summing up a night that did not run."""
    from agent.core.domain import ExperimentStatus
    from agent.core.errors import RunNotStartedError
    from agent.core.record import Ending

    hit = [e for e in rt.store.list_experiments(sweep.id, [ExperimentStatus.CANCELLED])
           if e.record is not None and e.record.ending is Ending.NOT_STARTED
           and e.finished_at is not None and e.finished_at >= since]
    if not hit:
        return
    label = "the baseline" if hit[0].is_baseline else f"experiment {hit[0].id}"
    command = shlex.join(["overnight", "run", "--target", str(target), "--sweep", sweep.name,
                          "--resume", "--db", str(rt.db)])
    console.print(f"sweep {sweep.name} is paused: {label} was not started and is queued again; "
                  f"once fixed, resume with: {command}", soft_wrap=True, markup=False)
    raise RunNotStartedError(hit[0].reason or "the executor could not start a run")


# --- confirm: does the gain hold at a larger setting ------------------------------------------
@app.command()
def confirm(
    sweep: Annotated[str, typer.Option(help="sweep name")],
    at: Annotated[str, typer.Option(help=AT_HELP)],
    seeds: SeedsOpt = CONFIRM_SEEDS,
    slots: SlotsOpt = None,
    devices: DevicesOpt = None,
    db: DbOpt = None,
    work_dir: WorkDirOpt = None,
) -> None:
    """Re-run the baseline and the best at a larger setting and say whether the gain holds,
    shrinks or flips (recorded as a confirmation sweep; `overnight report` shows it)."""
    from agent.analysis.confirm import parse_at
    from agent.core.errors import ConfigError

    try:
        setting = parse_at(at)
    except ConfigError as exc:
        fail(str(exc).replace("--confirm-at", "--at"))
    confirm_sweep(db, work_dir, sweep, setting, seeds, slots, devices)


def confirm_sweep(db: str | None, work_dir: Path | None, name: str, at: ConfirmAt,
                  seeds: int, slots: int | None, devices: str | None) -> None:
    """Hold the lock, build the confirmation sweep of `name` at `at`, run it, print it."""
    from agent.engine.scheduler import SchedulerSettings
    from agent.ops.confirm import night_device, prepare_confirm

    rt = runtime_for(db, work_dir)
    found = find_sweep(rt.store, name, None, db_location(db))
    n_slots, on = slots_and_devices(slots, devices)
    rt.hold_lock(hint=" (confirm runs its runs itself; stop that process first)")
    try:
        rt.recover()
        repo = open_target(Path(found.target_path))
        conf = prepare_confirm(rt.store, repo, found, at, seeds)
        console.print(f"confirmation sweep [bold]{conf.name}[/bold]: the baseline and the best "
                      f"at {at.text()}, {seeds} seeds each ({2 * seeds} runs)")
        device = at.device or night_device(rt.store, found)  # else where the night ran
        settings = SchedulerSettings(slots=n_slots, devices=on, device=device)
        drive_locked(rt, conf, settings)
    except OvernightError as exc:
        fail(str(exc))
    finally:
        rt.release_lock()
    print_confirmation(rt.store, found.name)


def print_confirmation(store: Store, name: str) -> None:
    from agent.analysis.morning_md import confirmation_markdown
    from agent.ops.morning import report_of

    found = report_of(store, name).confirmation
    if found is None:
        console.print("the confirmation did not finish: `overnight report` shows it once it has")
        return
    sys.stdout.write("\n" + confirmation_markdown(found) + "\n")
    console.print(f"the full report: overnight report --sweep {name}")


def has_gain(store: Store, sweep: Sweep) -> bool:
    """Did the night keep a change (something to confirm)?"""
    from agent.core.errors import ConflictError
    from agent.ops.finalize import kept_chain

    try:
        return bool(kept_chain(store, sweep)[1])
    except ConflictError:
        return False


def check_confirm_at(text: str | None, target: Path) -> ConfirmAt | None:
    """`run --confirm-at`, checked before the night starts: the setting parsed and a size
    knob found in the target's committed files (None without one). Exits on bad input."""
    if text is None:
        return None
    from agent.analysis.confirm import parse_at
    from agent.ops.confirm import find_knob

    try:
        at = parse_at(text)
        if at.knob is not None:
            find_knob(open_target(target), "HEAD", load_config(target), at.knob)
    except OvernightError as exc:
        fail(str(exc))
    return at


# --- finalize: the kept chain as a branch, and the ablation -----------------------------------
@app.command()
def finalize(
    sweep: Annotated[str, typer.Option(help="sweep name")],
    ablate: Annotated[bool, typer.Option(help="also run the best minus each kept change "
                                         "(--seeds runs each) and attribute the gain")] = False,
    seeds: Annotated[int, typer.Option(min=2, max=20, help="with --ablate: runs per variant, "
                                       "seeds seed … seed+k−1 for every variant")]
    = ABLATION_SEEDS,
    budget: Annotated[float | None, typer.Option(help="with --ablate: training seconds per "
                                                 "run (default: the sweep's)")] = None,
    device: Annotated[str | None, typer.Option(help="with --ablate: OVERNIGHT_DEVICE for the "
                                               "script")] = None,
    slots: SlotsOpt = None,
    devices: DevicesOpt = None,
    db: DbOpt = None,
    work_dir: WorkDirOpt = None,
) -> None:
    """The kept chain as a new branch (one commit per kept change on the baseline, each with its
    evidence); the sweep's and your branches do not move. --ablate: leave-one-out runs that
    attribute the night's gain to each kept change."""
    from agent.engine.scheduler import SchedulerSettings
    from agent.ops.finalize import finalize as replay
    from agent.ops.finalize import prepare_ablation

    rt = runtime_for(db, work_dir)
    found = find_sweep(rt.store, sweep, None, db_location(db))
    if ablate:  # the lock before anything is made: a busy database changes nothing
        n_slots, on = slots_and_devices(slots, devices)
        rt.hold_lock(hint=" (finalize --ablate runs the variants itself; stop that process, "
                     "or finalize without --ablate)")
        rt.recover()
    try:
        repo = open_target(Path(found.target_path))
        if not found.status.is_finished():
            console.print(f"sweep {found.name} is {found.status.value}: this is its kept chain "
                          "as of now")
        done = replay(rt.store, repo, found)
        print_finalized(done, found)
        if not ablate:
            return
        abl = prepare_ablation(rt.store, repo, found, done, seeds, budget)
        variants = abl.max_experiments or 0
        console.print(f"ablation sweep [bold]{abl.name}[/bold]: the best and {variants} "
                      f"variant(s), {seeds} seeds each ({(variants + 1) * seeds} runs at most)")
        settings = SchedulerSettings(slots=n_slots, devices=on, device=device)
        drive_locked(rt, abl, settings)
    except OvernightError as exc:
        fail(str(exc))
    finally:
        rt.release_lock()
    print_attribution(rt.store, found.name)


def print_finalized(done, sweep) -> None:  # type: ignore[no-untyped-def]
    console.print(f"{len(done.commits)} kept change(s) replayed on the baseline "
                  f"{done.base[:7]} (sweep {sweep.name}; its branch {sweep.branch} did not move):")
    for i, sha in done.commits:
        console.print(f"  {sha[:7]} #{i}", soft_wrap=True)
    console.print(f"merge it with: git merge {escape(done.branch)}", soft_wrap=True)
    console.print(f"branch: [bold]{escape(done.branch)}[/bold]", soft_wrap=True)


def print_attribution(store, name: str) -> None:  # type: ignore[no-untyped-def]
    from agent.analysis.morning_md import attribution_markdown
    from agent.ops.morning import report_of

    found = report_of(store, name).attribution
    if found is None:
        console.print("the ablation did not finish: `overnight report` shows it once it has")
        return
    sys.stdout.write("\n" + attribution_markdown(found) + "\n")
    console.print(f"the full report: overnight report --sweep {name}")


# --- the entry point --------------------------------------------------------------------------
# The order `overnight --help` lists the commands in (registration order would follow the
# modules' import order instead); a command not named here comes last.
HELP_ORDER = ("adopt", "mcp", "tools", "agent-instructions", "confirm", "doctor", "gc", "report",
              "finalize", "results", "status", "export", "serve", "token", "init", "run", "demo")


def _help_rank(command: CommandInfo) -> int:
    name = command.name or getattr(command.callback, "__name__", "")
    return HELP_ORDER.index(name) if name in HELP_ORDER else len(HELP_ORDER)


app.registered_commands.sort(key=_help_rank)


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
