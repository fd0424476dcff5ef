"""The Slurm executor: each run as one Slurm batch job, in its worktree on a shared filesystem.

`SlurmExecutor` (`executor = "slurm"`) hands out one `SlurmRunner` per loop: the Runner port
(agent.core.ports), so agent.engine.loop runs a Slurm run exactly like a local one. The
coordinator keeps the database, git and decisions; a run is `sbatch --parsable` of a job whose
half (agent.executors.slurm_job) runs the command with the same runner as a local run, in the
run's own worktree under the work dir, which the nodes must share (checked at the start: a
refusal names the paths and the nodes). Each job asks for the run's time limit (timeout + grace +
backstop, in whole minutes), `--gres=gpu:N` (or the site's gres), and the partition, account,
qos and extra #SBATCH lines of the settings. agent.executors.slurm_follow follows it.

Guaranteed: a run is submitted once. Its job folder (work dir/slurm/<token>) is written before
sbatch and named in the job's name, so after a kill -9 of the service the next start finds every
job it left (queued, running, or ended meanwhile with its result on disk); restart recovery keeps
their worktrees, and the retry of the interrupted experiment adopts its job (the same commit
tree, command and seed) instead of submitting another: the job id is recorded on both runs.
A job whose experiment has no retry left to adopt it is cancelled. The run's processes carry
OVERNIGHT_RUN_ID prefixed with "slurm:", so recovery's sweep of this machine leaves a job that
runs here to Slurm. Not guaranteed: adoption when the retry's commit differs (another change was
kept meanwhile): that job is cancelled as soon as the retry's own run starts, and the change runs
again on the new head.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.core.domain import Sweep
from agent.core.errors import ConfigError, RunNotStartedError
from agent.core.private import DIR_MODE
from agent.executors import slurm_cli
from agent.executors.slurm_adopt import Orphan, discard, remove_worktree, take_over
from agent.executors.slurm_cli import SlurmError
from agent.executors.slurm_follow import JobBoard, JobFollow
from agent.executors.slurm_job import JobFiles, JobRequest
from runner.environment import is_allowed
from runner.result import RunResult
from runner.tree import RUN_ID_ENV

logger = logging.getLogger(__name__)

RUN_ID_PREFIX = "slurm:"  # before a Slurm run's OVERNIGHT_RUN_ID (restart recovery skips it)
JOB_NAME = "overnight-"  # + the work dir's key + "-" + the job folder's token
# Settings a run's identity does not depend on: which experiment executes it, where its
# worktree happens to be.
VOLATILE_ENV = frozenset({RUN_ID_ENV, "OVERNIGHT_EXPERIMENT_ID"})


@dataclass(frozen=True)
class SlurmSettings:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gpus: int = 1  # --gres=gpu:N per run (0: none)
    gres: str | None = None  # the site's own generic resources instead, e.g. "gpu:a100:1"
    options: tuple[str, ...] = ()  # extra #SBATCH lines, e.g. "--mem=64G"
    grace_s: float = 5.0  # SIGTERM → SIGKILL inside the job
    backstop_s: float = 60.0  # past timeout + grace: the job is cancelled from here

    def minutes(self, timeout_s: float) -> int:
        """A job's --time: the run's timeout, the grace, the backstop and a minute."""
        return max(1, math.ceil((timeout_s + self.grace_s + self.backstop_s + 60) / 60))

    def sbatch_options(self, timeout_s: float) -> list[str]:
        """The options every job of these settings is submitted with."""
        options = [f"--time={self.minutes(timeout_s)}", "--requeue", "--nodes=1", "--ntasks=1"]
        for flag, value in (("partition", self.partition), ("account", self.account),
                            ("qos", self.qos)):
            if value:
                options.append(f"--{flag}={value}")
        gres = self.gres or (f"gpu:{self.gpus}" if self.gpus else None)
        if gres:
            options.append(f"--gres={gres}")
        return options


# sbatch's refusals by their words (Slurm's own), each with the setting that fixes it.
REFUSALS = (
    (r"polic", "the cluster's limits refuse it (how many jobs, their size or time): lower "
     "--slots, timeout_s or what each job asks for"),
    (r"contact slurm controller", "is slurmctld up? (`scontrol ping` says)"),
    (r"\baccount\b", "name an account of yours with --slurm-account (`sacctmgr show assoc "
     "user=$USER` lists them)"),
    (r"partition", "name one of `sinfo`'s partitions with --slurm-partition"),
    (r"\bqos\b", "name a QOS of yours with --slurm-qos, or leave it out"),
    (r"time limit", "each job asks for --time={minutes} (timeout_s, the grace and a margin): "
     "lower timeout_s in overnight.toml, or pick a partition that allows it"),
    (r"node configuration", "no node of the partition has what each job asks for: ask for "
     "less (--slurm-gpus, --slurm-option) or pick another --slurm-partition"),
)


def refusal(words: str, settings: SlurmSettings, timeout_s: float) -> str:
    """The one sentence a user reads when sbatch refuses a run's job: Slurm's words, then the
    fix where they name the setting at fault (a GPU asked for by default, first)."""
    said = words.lower()
    fix = next((f.format(minutes=settings.minutes(timeout_s)) for pattern, f in REFUSALS
                if re.search(pattern, said)), None)
    if "gres" in said or "generic resource" in said:
        if settings.gres:
            fix = (f"the nodes may have no gres {settings.gres!r}: name one they have with "
                   "--slurm-gres (`scontrol show node` lists them), or run with --slurm-gpus 0")
        elif settings.gpus:
            fix = ("this cluster may have no GPUs: run with --slurm-gpus 0, or name its gres "
                   "with --slurm-gres")
        else:
            fix = "this cluster may have no GPUs: drop the GPU request from --slurm-option"
    return f"sbatch refused the job: {words}" + (f"; {fix}" if fix else "")


def sbatch_line(line: str) -> str:
    """An extra #SBATCH line as written in the job script ("--mem=64G"; a leading "#SBATCH"
    is accepted); ConfigError for anything that is not one sbatch option."""
    text = line.strip().removeprefix("#SBATCH").strip()
    if not text.startswith("-") or "\n" in text or "\r" in text:
        raise ConfigError(f"--slurm-option: expected one sbatch option such as '--mem=64G', "
                          f"got {line!r}")
    return text


def job_environment(pass_env: Sequence[str]) -> dict[str, str]:
    """What sbatch and so the job get of this process's environment: what a run may get
    (runner.environment's allow-list and the target's pass_env names) and Slurm's own
    variables; never the service's secrets (they would sit in Slurm's job records)."""
    named = set(pass_env)
    return {k: v for k, v in os.environ.items()
            if is_allowed(k) or k in named or k.startswith("SLURM_")}


def work_key(work_dir: Path) -> str:
    return hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:12]


class SlurmExecutor:
    """Submits, follows and adopts the jobs of one work dir."""

    def __init__(self, settings: SlurmSettings, work_dir: Path, *,
                 follow_up: Callable[[int], int | None] | None = None,
                 python: str = sys.executable, check: bool = True) -> None:
        self.settings, self.work_dir, self.python = settings, work_dir.resolve(), python
        self.options = [sbatch_line(line) for line in settings.options]
        self.prefix = f"{JOB_NAME}{work_key(self.work_dir)}-"
        self.follow_up = follow_up or (lambda exp_id: exp_id)
        self.board = JobBoard(self.prefix, tick=self.reap)
        self._orphans: list[Orphan] = []
        self._lock = threading.Lock()
        if check:
            self.check_shared([self.work_dir, Path(python).parent])

    def check_shared(self, paths: Sequence[Path]) -> None:
        """ConfigError when the partition's nodes may not see `paths` (slurm_cli)."""
        problem = slurm_cli.shared_problem(paths, slurm_cli.partition_nodes(
            self.settings.partition))
        if problem:
            raise ConfigError(f"executor 'slurm': {problem}")

    def runner(self, sweep: Sweep) -> SlurmRunner:
        config = sweep.config
        if config.sandbox == "bwrap":
            raise ConfigError("sandbox = 'bwrap' is not supported with executor 'slurm'; run "
                              "this target with the local executor")
        if config.assets:  # linked from the target's folder into each worktree
            self.check_shared([Path(sweep.target_path)])
        return SlurmRunner(self, sweep)

    # --- submitting ------------------------------------------------------------------------
    def submit(self, request: JobRequest, timeout_s: float) -> tuple[JobFiles, str]:
        """Write the job's folder, then sbatch it: (its folder, its job id)."""
        token = uuid.uuid4().hex[:16]
        files = JobFiles(self.work_dir / "slurm" / token)
        files.root.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
        files.root.mkdir(mode=DIR_MODE)
        files.write_request(request)
        lines = "".join(f"#SBATCH {line}\n" for line in self.options)
        files.script.write_text(
            f"#!/bin/sh\n# overnight: one run of experiment {request.experiment_id}\n{lines}"
            f"exec {shlex.quote(self.python)} -m agent.executors.slurm_job "
            f"{shlex.quote(str(files.root))}\n", encoding="utf-8")
        options = [f"--job-name={self.prefix}{token}", f"--output={files.output}",
                   f"--chdir={files.root}", *self.settings.sbatch_options(timeout_s)]
        try:
            job_id = slurm_cli.submit(files.script, options, job_environment(request.pass_env))
        except SlurmError as exc:  # the run cannot start: the sweep pauses with the sentence
            shutil.rmtree(files.root, ignore_errors=True)
            raise RunNotStartedError(refusal(exc.refusal, self.settings, timeout_s)
                                     if exc.refusal else str(exc)) from None
        except Exception:
            shutil.rmtree(files.root, ignore_errors=True)
            raise
        files.job_id.write_text(job_id + "\n", encoding="utf-8")
        self.board.watch(job_id)
        logger.info("submitted Slurm job %s (experiment %d)", job_id, request.experiment_id)
        return files, job_id

    # --- adopting what a dead service left ----------------------------------------------------
    def adopt(self, folders: Sequence[JobFiles]) -> list[Orphan]:
        """Take a previous life's jobs: those still in Slurm, or ended with their result on
        disk, wait for their experiment's retry; the rest are removed. Returns those kept."""
        by_name = {s.name: s for s in slurm_cli.jobs(self.prefix).values()}
        kept = []
        for files in folders:
            try:
                request = files.read_request()
            except (OSError, ValueError, TypeError) as exc:
                logger.warning("unreadable Slurm job folder %s (%s): removed", files.root, exc)
                shutil.rmtree(files.root, ignore_errors=True)
                continue
            state = by_name.get(self.prefix + files.root.name)
            record = files.read_result()
            job_id = (files.recorded_job_id() or (state.job_id if state else None)
                      or (str(record.get("job_id") or "") if record else None))
            if not job_id or (record is None and (state is None or not state.alive)):
                logger.info("Slurm job folder %s: its job (%s) is gone without a result",
                            files.root.name, job_id or "never submitted")
                discard(files, job_id)
                continue
            self.board.watch(job_id)
            kept.append(Orphan(files, request, job_id))
            logger.warning("Slurm job %s of experiment %d outlived the service: it waits for "
                           "the experiment's retry to adopt it", job_id, request.experiment_id)
        with self._lock:
            self._orphans += kept
        return kept

    def claim(self, experiment_id: int, key: str) -> Orphan | None:
        """The left job that `experiment_id` (a retry of its experiment) adopts, if any."""
        with self._lock:
            for orphan in self._orphans:
                if orphan.request.key == key and \
                        self.follow_up(orphan.request.experiment_id) == experiment_id:
                    self._orphans.remove(orphan)
                    return orphan
        return None

    def supersede(self, request: JobRequest) -> None:
        """Cancel the left job of this run's experiment that it can no longer adopt: one of
        its own commit, built on a head that has moved since (this run's tree differs)."""
        with self._lock:
            stale = [o for o in self._orphans if o.request.own and request.own
                     and o.request.tree != request.tree
                     and self.follow_up(o.request.experiment_id) == request.experiment_id]
            self._orphans = [o for o in self._orphans if o not in stale]
        for orphan in stale:
            logger.warning("Slurm job %s: experiment %d now runs on another head; cancelled",
                           orphan.job_id, request.experiment_id)
            self.board.forget(orphan.job_id)
            discard(orphan.files, orphan.job_id)

    def reap(self) -> None:
        """Cancel left jobs whose experiment has nothing queued or running to adopt them."""
        with self._lock:
            unwanted = [o for o in self._orphans if self.follow_up(o.request.experiment_id)
                        is None]
            self._orphans = [o for o in self._orphans if o not in unwanted]
        for orphan in unwanted:
            logger.warning("Slurm job %s: experiment %d was settled without it; cancelled",
                           orphan.job_id, orphan.request.experiment_id)
            self.board.forget(orphan.job_id)
            discard(orphan.files, orphan.job_id)

    def orphans(self) -> list[Orphan]:
        with self._lock:
            return list(self._orphans)

    def close(self) -> None:
        """Cancel every job still followed (a clean shutdown stops its runs); jobs left by
        an earlier life and not adopted yet wait for the next start."""
        self.board.close()
        waiting = {o.job_id for o in self.orphans()}
        slurm_cli.cancel([j for j in self.board.watched() if j not in waiting])


class SlurmRunner:
    """The Runner port for one loop: each run is one Slurm job (see the module docstring)."""

    def __init__(self, executor: SlurmExecutor, sweep: Sweep) -> None:
        self.executor, self.sweep = executor, sweep

    def run(
        self,
        argv: list[str],
        *,
        cwd: Path,
        log_path: Path,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        on_start: Callable[[int, int], None] | None = None,
        on_line: Callable[[str], None] | None = None,
        stop_event: threading.Event | None = None,
        on_submit: Callable[[str], None] | None = None,
    ) -> RunResult:
        """Submit (or adopt) the run's job and follow it; `on_start` is never called (no local
        process group exists). Raises WorkerLostError when Slurm requeued, preempted or lost
        it; RunNotStartedError when sbatch refused the job, or SlurmJobError (one) when its
        node could not run it."""
        del on_start
        executor, settings = self.executor, self.executor.settings
        wt = Path(_git(cwd, "rev-parse", "--show-toplevel"))
        request = self._request(argv, wt, cwd, timeout_s, dict(env or {}), pass_env)
        orphan = executor.claim(request.experiment_id, request.key)
        if orphan is not None:
            files, job_id = orphan.files, orphan.job_id
            executor.board.watch(job_id)
            logger.warning("experiment %d adopts Slurm job %s", request.experiment_id, job_id)
        else:
            executor.supersede(request)
            files, job_id = executor.submit(request, timeout_s)
        try:
            if on_submit is not None:
                on_submit(job_id)
            result = JobFollow(executor.board, files, job_id, log_path, on_line, stop_event,
                               timeout_s, settings.grace_s, settings.backstop_s).run()
            if orphan is not None:
                take_over(orphan.request, request, [*self.sweep.config.protected,
                                                    *self.sweep.config.assets])
            return result
        except BaseException:  # lost, stopped by Ctrl-C, a bug: nothing of it runs on unseen
            slurm_cli.cancel([job_id])
            raise
        finally:
            executor.board.forget(job_id)
            if orphan is not None:
                remove_worktree(Path(orphan.request.worktree), Path(orphan.request.target))
            shutil.rmtree(files.root, ignore_errors=True)

    def _request(self, argv: list[str], wt: Path, cwd: Path, timeout_s: float,
                 env: dict[str, str], pass_env: Sequence[str]) -> JobRequest:
        """The job's request; its key is what the run is (tree, command, seed, settings), not
        where or for which experiment it runs."""
        run_id = env.get(RUN_ID_ENV, "")
        executing = run_id.split(":")[1] if run_id.count(":") >= 2 else "0"
        if run_id:
            env[RUN_ID_ENV] = RUN_ID_PREFIX + run_id
        where = str(wt.resolve())
        same = {k: v.replace(where, "{wt}") for k, v in env.items() if k not in VOLATILE_ENV}
        tree = _git(wt, "rev-parse", "HEAD^{tree}")
        identity = {"tree": tree,
                    "cwd": str(cwd.resolve().relative_to(wt.resolve())),
                    "argv": [a.replace(where, "{wt}") for a in argv], "env": same,
                    "pass_env": sorted(pass_env), "timeout_s": timeout_s}
        key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        return JobRequest(argv=list(argv), cwd=str(cwd.resolve()), timeout_s=timeout_s,
                          env=env, pass_env=list(pass_env),
                          grace_s=self.executor.settings.grace_s,
                          python=self.executor.python, key=key,
                          experiment_id=int(executing) if executing.isdigit() else 0,
                          tree=tree, own=env.get("OVERNIGHT_EXPERIMENT_ID") == executing,
                          worktree=where, target=str(Path(self.sweep.target_path).resolve()))


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True,
                          text=True, timeout=60).stdout.strip()
