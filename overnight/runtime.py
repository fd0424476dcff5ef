"""The one place that builds the object graph: a Runtime per database.

A Runtime owns the database engine and its Store, one GitRepo per target, the service layer,
and — once the engine is started — the database's instance lock, restart recovery, the slot
scheduler and the engine's listeners (the notifications, the trackers' mirror). Every entry
point (`overnight run`, `serve`, `mcp`, the docker app factory) builds a Runtime and hands it
down; nothing below this package builds collaborators of its own.

Start order: take the instance lock → recover what a dead process left → start the slots.
`close()` reverses it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.analysis.ablation import ablated_sweep
from agent.analysis.confirm import confirmed_sweep
from agent.core.domain import Sweep
from agent.core.errors import ConfigError, NotFoundError, OvernightError
from agent.core.ports import Proposer, Runner, Store
from agent.engine.ablation import AblationLoop
from agent.engine.attempt import EventFn, LoopSettings
from agent.engine.devices import slot_env
from agent.engine.loop import Loop
from agent.engine.recovery import DatabaseLock, InstanceLockError, RecoveryReport, recover
from agent.engine.scheduler import SchedulerSettings, SlotScheduler
from agent.engine.writes import DiskSpaceWatch, probe_folder
from agent.executors.local import SubprocessRunner
from agent.executors.ray import RayExecutor, RaySettings
from agent.executors.slurm import SlurmExecutor, SlurmSettings
from agent.executors.slurm_adopt import discard, job_folders, left_worktrees
from agent.git.repo import GitError, GitRepo
from agent.ops.retention import GcReport, RetentionPolicy, collect_garbage
from agent.ops.service import Service
from agent.ops.track import DEFAULT_DASHBOARD, OFF, Choice, Mirror
from db.engine import open_database
from db.location import DbLocation
from db.lock import instance_lock
from db.maintenance import checkpoint, database_size, vacuum, vacuum_pays
from db.reads import Reads
from db.store import SqlStore
from db.track_marks import TrackMarks
from overnight.environment import llm_config_path

if TYPE_CHECKING:
    from fastapi import FastAPI

    from agent.ops.notify import Notifier, NotifyConfig
    from api.settings import Settings

logger = logging.getLogger(__name__)
RETENTION_EVERY_S = 6 * 3600.0  # how often `serve --retention` prunes


def make_proposer(spec: str, seed: int, store: Store | None = None,
                  **kwargs: Any) -> Proposer | None:
    """`knobs` (the learning search), `queue` (external proposals only → None) or
    `llm:<profile>`.

    `store` lets a language-model proposer record spend that no proposal carries."""
    if spec == "knobs":
        from agent.proposers.knobs import KnobsProposer

        return KnobsProposer(seed=seed)
    if spec == "queue":
        return None
    if spec.startswith("llm:"):
        from agent.proposers.llm import make_llm_proposer

        return make_llm_proposer(spec.split(":", 1)[1], seed=seed, store=store, **kwargs)
    raise ConfigError(f"proposer: unknown proposer {spec!r} "
                      "(use knobs, queue or llm:<profile>)")


def compile_cache_env(work_dir: Path, sweep: Sweep) -> dict[str, str]:
    """A persistent torch.compile / Triton cache per sweep, so only the first run of a sweep
    pays the full compile (runs of one sweep compile nearly the same graphs)."""
    cache = work_dir / "cache" / sweep.name
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
            "TRITON_CACHE_DIR": str(cache / "triton")}


class Runtime:
    """Store, repositories, service layer, and (when started) lock, recovery and scheduler."""

    def __init__(self, db: DbLocation | Path | str, *, work_dir: Path | None = None,
                 llm_config: Path | None = None) -> None:
        self.db = DbLocation.parse(db)
        self.llm_config = llm_config  # else $OVERNIGHT_LLM_CONFIG, else ~/.overnight/llm.toml
        self.work_dir = (Path(work_dir).expanduser().resolve() if work_dir
                         else self.db.default_work_dir())
        self.engine = open_database(self.db)
        self.store = SqlStore(self.engine)
        self.reads = Reads(self.store)  # the pages' and commands' reads (db.reads)
        self.service = Service(self.store, self.repo_for, stop_running=self.stop_running)
        # Whether writes fail for lack of space, probed by a write to the database and one to
        # the work dir (logs, worktrees): the engine's pause, and what /health reports.
        self.disk_space = DiskSpaceWatch(probes=(self.store.check_writes,
                                                 lambda: probe_folder(self.work_dir)))
        self.lock: DatabaseLock | None = None
        self.recovery: RecoveryReport | None = None
        self.scheduler: SlotScheduler | None = None
        self._repos: dict[str, GitRepo] = {}
        self._repos_lock = threading.Lock()
        self._retention_stop: threading.Event | None = None
        self._ray: RayExecutor | None = None
        self._slurm: SlurmExecutor | None = None
        self.notify: NotifyConfig | None = None  # where the engine's notifications go
        self.notifier: Notifier | None = None
        self.track_marks = TrackMarks(self.engine)  # what the trackers hold (the ledger)
        self.track: Choice = None  # --track: one tracker for every sweep, OFF, or each its own
        self.dashboard_url = DEFAULT_DASHBOARD  # what a tracker's runs link to
        self.mirror: Mirror | None = None

    # --- repositories ----------------------------------------------------------------------
    def repo_at(self, path: Path | str) -> GitRepo:
        """The target repository at `path` (one adapter per target, shared). GitError if none."""
        key = str(Path(path).expanduser().resolve())
        with self._repos_lock:
            repo = self._repos.get(key)
            if repo is None:
                repo = self._repos[key] = GitRepo(key)
            return repo

    def repo_for(self, sweep: Sweep) -> GitRepo:
        return self.repo_at(sweep.target_path)

    # --- the engine ------------------------------------------------------------------------
    def hold_lock(self, lock: DatabaseLock | None = None, hint: str = "") -> DatabaseLock:
        """Take (or adopt) the database's instance lock: one executing process per database
        (a file lock beside SQLite, an advisory lock on PostgreSQL)."""
        if self.lock is None or not self.lock.held:
            if lock is not None and lock.held:
                self.lock = lock
            else:
                try:
                    self.lock = instance_lock(self.db)
                except InstanceLockError as exc:
                    raise OvernightError(f"{exc}{hint}") from None
        return self.lock

    def release_lock(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def recover(self, settings: SchedulerSettings | None = None) -> RecoveryReport:
        """Interrupt and re-queue what a dead process left running (needs the lock). Slurm
        jobs it left go on: with `settings` for executor 'slurm' their experiments' retries
        adopt them; with another executor they are cancelled; without settings (a command
        that runs no engine of its own) they wait for the next engine."""
        self.hold_lock()
        slurm = (self.slurm_executor(settings) if settings is not None
                 and settings.executor == "slurm" else None)  # refuses a bad site at start
        folders = job_folders(self.work_dir)
        self.recovery = recover(self.store, self.repo_for, self.work_dir,
                                keep_worktrees=left_worktrees(self.work_dir))
        if slurm is not None and folders:
            slurm.adopt(folders)
        elif folders and settings is not None:
            logger.warning("%d Slurm job(s) of an earlier start are cancelled: this engine "
                           "runs with executor %r", len(folders), settings.executor)
            for files in folders:
                discard(files, files.recorded_job_id())
        return self.recovery

    def follow_up(self, experiment_id: int) -> int | None:
        """The queued or running experiment that carries this one's work on (itself, or its
        latest retry), or None when it and its retries are all settled."""
        try:
            exp = self.store.get_experiment(experiment_id)
            while exp.status.is_finished():
                retry = self.store.retry_of(exp.id)
                if retry is None:
                    return None
                exp = retry
        except NotFoundError:
            return None
        return exp.id

    def loop_factory(self, settings: SchedulerSettings,
                     on_event: EventFn | None = None,
                     proposer_kwargs: dict[str, Any] | None = None,
                     ) -> Callable[[Sweep, int], Loop | AblationLoop]:
        """Loops for the engine's slots: subprocess runner, the sweep's proposer, slot env."""

        def make(sweep: Sweep, slot: int) -> Loop | AblationLoop:
            runner: Runner
            if settings.executor == "ray":  # Ray places runs on GPUs and caches per worker
                env = dict(settings.extra_env)
                runner = self.ray_executor(settings).runner(
                    sweep, lambda: self.store.protected_hashes(sweep.id))
            elif settings.executor == "slurm":  # Slurm places runs; the work dir is shared
                env = {**compile_cache_env(self.work_dir, sweep), **settings.extra_env}
                runner = self.slurm_executor(settings).runner(sweep)
            else:
                env = {**slot_env(slot, settings.devices),
                       **compile_cache_env(self.work_dir, sweep), **settings.extra_env}
                runner = SubprocessRunner(settings.grace_s)
            loop_settings = LoopSettings(work_dir=self.work_dir, env=env, grace_s=settings.grace_s,
                                         device=settings.device)
            if ablated_sweep(sweep.proposer) is not None or \
                    confirmed_sweep(sweep.proposer) is not None:  # finalize --ablate, confirm
                return AblationLoop(self.store, self.repo_for(sweep), runner, loop_settings,
                                    on_event=on_event)
            proposer = self.make_proposer(sweep.proposer, sweep.seed, **(proposer_kwargs or {}))
            return Loop(self.store, self.repo_for(sweep), runner, loop_settings,
                        proposer=proposer, on_event=on_event, disk_space=self.disk_space)

        return make

    def make_proposer(self, spec: str, seed: int, **kwargs: Any) -> Proposer | None:
        """The proposer `spec` names (ConfigError for an unknown one); a language model's
        profiles come from --llm-config, else $OVERNIGHT_LLM_CONFIG, else ~/.overnight/llm.toml."""
        if spec.startswith("llm:"):
            kwargs.setdefault("config_path", llm_config_path(self.llm_config))
        return make_proposer(spec, seed, store=self.store, **kwargs)

    def ray_executor(self, settings: SchedulerSettings) -> RayExecutor:
        """The one connection to the Ray cluster of `settings` (joined on first use)."""
        with self._repos_lock:
            if self._ray is None:
                self._ray = RayExecutor(RaySettings(
                    address=settings.ray_address, num_gpus=settings.ray_gpus,
                    num_cpus=settings.ray_cpus, resources=dict(settings.ray_resources),
                    grace_s=settings.grace_s))
            return self._ray

    def slurm_executor(self, settings: SchedulerSettings) -> SlurmExecutor:
        """The one Slurm executor of this work dir (ConfigError when the partition's nodes
        cannot see it, or Slurm's commands are missing)."""
        with self._repos_lock:
            if self._slurm is None:
                self._slurm = SlurmExecutor(SlurmSettings(
                    partition=settings.slurm_partition, account=settings.slurm_account,
                    qos=settings.slurm_qos, gpus=settings.slurm_gpus, gres=settings.slurm_gres,
                    options=tuple(settings.slurm_options), grace_s=settings.grace_s),
                    self.work_dir, follow_up=self.follow_up)
            return self._slurm

    def start_engine(self, settings: SchedulerSettings, *, lock: DatabaseLock | None = None,
                     hint: str = "") -> SlotScheduler:
        """Lock → recover → start the slot scheduler (slots=0: scheduled starts only). When the
        disk is full, recovery (which must write) and the start wait for space in the
        background, so the API still answers meanwhile."""
        self.hold_lock(lock, hint)
        if self.notify is not None and self.notify.targets:
            self.notifier = make_notifier(self.store, self.notify)
        if self.track != OFF:  # sweeps with their own [track] may come at any time
            self.start_mirror()
        on_event = hear_all(self.notifier.on_event if self.notifier else None,
                            self.mirror.on_event if self.mirror else None)
        self.scheduler = SlotScheduler(self.store, settings,
                                       self.loop_factory(settings, on_event=on_event),
                                       disk_space=self.disk_space)
        try:
            self.recover(settings)
        except Exception as exc:
            if not self.disk_space.note_failure(exc, "restart recovery"):
                raise
            self.scheduler.start_when_writable(lambda: self.recover(settings))
            return self.scheduler
        self.scheduler.start()
        return self.scheduler

    # --- the trackers --------------------------------------------------------------------
    def start_mirror(self, track: Choice | None = None) -> Mirror:
        """The trackers' mirror (agent.ops.track) on this database, started: `track` (else
        the runtime's --track choice) names the tracker for every sweep, or None for each
        sweep's own [track] table."""
        if self.mirror is None:
            self.mirror = self.make_mirror(track if track is not None else self.track).start()
        return self.mirror

    def make_mirror(self, track: Choice) -> Mirror:
        return Mirror(self.store, self.track_marks, track=track, base_url=self.dashboard_url,
                      light=lambda s: self.reads.experiment_marks(s.id))

    def close_mirror(self, timeout_s: float = 15.0) -> None:
        if self.mirror is not None:
            self.mirror.close(timeout_s)
            self.mirror = None

    # --- retention -------------------------------------------------------------------------
    def collect_garbage(self, policy: RetentionPolicy, *, dry_run: bool = False) -> GcReport:
        """`overnight gc` without its report of sizes: prune, then VACUUM if it pays."""
        report = collect_garbage(self.store, self.repo_for, self.work_dir, policy,
                                 dry_run=dry_run)
        if not dry_run:
            checkpoint(self.engine)
            if vacuum_pays(database_size(self.engine)):
                vacuum(self.engine)  # StoreError (busy): logged, tried again next pass
        return report

    def start_retention(self, policy: RetentionPolicy,
                        every_s: float = RETENTION_EVERY_S) -> None:
        """Run `collect_garbage(policy)` now and every `every_s` in a daemon thread, until
        `close()` (the retention setting of `overnight serve`)."""
        stop = self._retention_stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                try:
                    self.collect_garbage(policy)
                except Exception:  # noqa: BLE001 - one failed pass must not end retention
                    logger.exception("retention: gc failed; trying again in %.0f s", every_s)
                stop.wait(every_s)

        threading.Thread(target=loop, name="overnight-retention", daemon=True).start()

    def stop_running(self, experiment_id: int) -> bool:
        """Ask the engine to stop a running experiment of this process; False if not here."""
        return bool(self.scheduler is not None and self.scheduler.cancel(experiment_id))

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the engine (runs in flight are recorded interrupted), release the lock."""
        if self.scheduler is not None:
            self.scheduler.shutdown(timeout_s=timeout_s)
            self.scheduler = None
        if self.notifier is not None:  # what the engine's last runs called for, briefly
            self.notifier.close()
            self.notifier = None
        self.close_mirror()  # the last experiments and the sweeps' ends, briefly
        if self._retention_stop is not None:
            self._retention_stop.set()
        if self._ray is not None:
            self._ray.close()
            self._ray = None
        if self._slurm is not None:
            self._slurm.close()
            self._slurm = None
        self.release_lock()
        self.engine.dispose()


def hear_all(*listeners: EventFn | None) -> EventFn | None:
    """One event callback that hands each event to every listener given (None: none)."""
    given = [f for f in listeners if f is not None]
    if len(given) < 2:
        return given[0] if given else None

    def on_event(kind: str, exp: Any, data: dict[str, Any]) -> None:
        for f in given:
            f(kind, exp, data)

    return on_event


def open_target(path: Path) -> GitRepo:
    """A target repository for a CLI command, with git's problem as a readable error."""
    try:
        return GitRepo(path)
    except GitError as exc:
        raise OvernightError(str(exc)) from None


def service_app(settings: Settings, *, lock: DatabaseLock | None = None,
                notify: NotifyConfig | None = None, track: Choice = None,
                dashboard_url: str | None = None) -> FastAPI:
    """The HTTP service on a new Runtime for `settings.db_path` (api.main.create_app);
    `notify`: where its engine's notifications go; `track`: the --track choice, and
    `dashboard_url` what the trackers' runs link to."""
    from api.main import create_app

    runtime = Runtime(settings.db_path, work_dir=settings.work_dir)
    runtime.notify, runtime.track = notify, track
    runtime.dashboard_url = dashboard_url or runtime.dashboard_url
    return create_app(settings, runtime, lock=lock)


def make_notifier(store: Store, config: NotifyConfig) -> Notifier | None:
    """A started Notifier for `config`, or None when it names no URL."""
    if not config.targets:
        return None
    from agent.ops.morning import headline_of
    from agent.ops.notify import Notifier

    def headline(name: str) -> str:
        return headline_of(store, name).text()

    logger.info("notifications to %s", ", ".join(str(t) for t in config.targets))
    return Notifier(config.targets, store, headline=headline,
                    crash_streak=config.crash_streak).start()
