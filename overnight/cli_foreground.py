"""A sweep run in the foreground (`overnight run`, `overnight demo`): hold the database's
instance lock, recover leftovers, create or resume the sweep, drive the engine in burst mode with
a live view, and turn Ctrl-C/SIGTERM into a recorded, resumable stop.
"""

from __future__ import annotations

import shlex
import signal
import threading
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from agent.core.config import load_config
from agent.core.domain import Sweep
from agent.core.errors import INTERRUPT_PREFIX, Interrupted
from agent.engine.interrupts import deliver
from agent.ops.track import OFF
from db.location import DbLocation
from overnight.cli_common import console, err, fail, runtime_for
from overnight.notifications import make_notifier
from overnight.runtime import Runtime, hear_all, open_target

if TYPE_CHECKING:
    from agent.core.config import TargetConfig
    from agent.engine.attempt import EventFn
    from agent.engine.scheduler import SchedulerSettings
    from agent.git.repo import GitRepo
    from agent.ops.notify import Notifier
    from agent.ops.notify_config import NotifyConfig
    from agent.ops.track import Choice


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
    notify: NotifyConfig | None = None,
    track: Choice = None,
) -> Sweep:
    """Hold the database's instance lock, recover leftovers, then run one sweep to its end.

    `runs_on`: the executor's SchedulerSettings fields (executor_options). `notify`: where
    notifications go (none by default). `track`: the --track choice (by default the sweep's
    own [track] table, if any, names its tracker)."""
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
                           allow_dirty=allow_dirty, notifier=notifier, track=track)
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
        deliver(KeyboardInterrupt())

    def on_term(_signum: int, _frame: Any) -> None:
        deliver(Interrupted("SIGTERM"))

    return {signal.SIGINT: signal.signal(signal.SIGINT, on_int),
            signal.SIGTERM: signal.signal(signal.SIGTERM, on_term)}


def _interrupted(rt: Runtime, sweep: Sweep, target: Path, exc: KeyboardInterrupt,
                 since: datetime) -> None:
    """Say what a Ctrl-C/SIGTERM did and how to resume; pause the sweep so that a service on
    the same database does not carry on with it. Exits 130 (SIGINT) or 143 (SIGTERM)."""
    from agent.core.domain import ExperimentStatus, SweepStatus

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
    notifier: Notifier | None = None, track: Choice = None,
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
        f"{experiments} experiments, budget {config.budget_s:g}s, db {rt.db}"
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

    view = LiveView(console, sweep) if console.is_terminal else LineLog(console, sweep)
    hear = [f for f in (None if quiet else view.on_event, also) if f is not None]

    def on_event(kind: str, exp: Any, data: dict[str, Any]) -> None:
        for f in hear:
            f(kind, exp, data)

    engine = SlotScheduler(rt.store, settings, rt.loop_factory(
        settings, on_event=on_event if hear else None, proposer_kwargs=proposer_kwargs),
        writes=rt.writes)
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
