"""Slurm's commands as functions: sbatch, squeue, scancel, sinfo (subprocesses; stdlib only).

Used by agent.executors.slurm. Every call has a timeout; a command that is missing is a
ConfigError naming it, one that fails is a SlurmError with Slurm's own message. Job states come
from `squeue --me -t all` (no accounting database is needed: a finished job stays listed for the
cluster's MinJobAge, 300 s by default), one call for every job of this user.
"""

from __future__ import annotations

import logging
import re
import shutil
import socket
import subprocess
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from agent.core.errors import ConfigError, OvernightError

logger = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 60.0
FIELDS = ("JobID", "Name", "State", "Reason", "RestartCnt", "NodeList")
# States of a job that has not ended (squeue's long names).
ALIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                   "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT",
                   "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"})
# Filesystems every node of a cluster can mount (a local one is seen by its own machine only).
SHARED_FILESYSTEMS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "ceph", "cephfs",
                                "glusterfs", "fuse.glusterfs", "cifs", "smb3", "panfs", "wekafs",
                                "fuse.weka", "orangefs", "pvfs2", "ocfs2", "gfs2", "fuse.juicefs",
                                "fuse.s3fs", "virtiofs", "9p", "afs", "fuse.sshfs"})


class SlurmError(OvernightError):
    """A Slurm command failed; the message is Slurm's own. `refusal`: the command answered
    with an error (its words without the "sbatch: error:" prefixes), rather than not at all."""

    def __init__(self, message: str, refusal: str | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal


@dataclass(frozen=True)
class JobState:
    """One job as squeue lists it."""

    job_id: str
    name: str
    state: str  # PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, PREEMPTED, NODE_FAIL, …
    reason: str
    restarts: int  # how many times Slurm requeued it
    nodes: str

    @property
    def alive(self) -> bool:
        return self.state in ALIVE


def _run(argv: list[str], what: str, env: dict[str, str] | None = None) -> str:
    if shutil.which(argv[0]) is None:
        raise ConfigError(f"executor 'slurm' needs Slurm's `{argv[0]}` command on this machine "
                          "(a login node of the cluster, with the cluster's slurm.conf)")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env,
                              timeout=COMMAND_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{what}: `{argv[0]}` did not answer within "
                         f"{COMMAND_TIMEOUT_S:.0f} s (is slurmctld up?)") from None
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        last = lines[-1] if lines else f"exit status {proc.returncode}"
        raise SlurmError(f"{what}: {last}", _words(last, argv[0]))
    return proc.stdout


def _words(line: str, command: str) -> str:
    """Slurm's own words in an error line ("sbatch: error: Batch job submission failed: X" →
    "X")."""
    for prefix in (f"{command}: ", "error: ", "Batch job submission failed: "):
        line = line.removeprefix(prefix)
    return line.strip()


def submit(script: Path, options: list[str], env: dict[str, str] | None = None) -> str:
    """sbatch --parsable: the new job's id. `env` is sbatch's environment, which the job gets
    (sbatch's default --export=ALL)."""
    out = _run(["sbatch", "--parsable", *options, str(script)], "sbatch", env)
    job_id = out.strip().split(";")[0]
    if not re.fullmatch(r"[0-9][0-9_+]*", job_id):
        raise SlurmError(f"sbatch: unexpected answer {out.strip()!r}")
    return job_id


def jobs(name_prefix: str) -> dict[str, JobState]:
    """Every listed job of this user whose name starts with `name_prefix`, by id."""
    out = _run(["squeue", "--me", "--noheader", "--states=all",
                "--Format=" + ",".join(f"{f}:|" for f in FIELDS)], "squeue")
    found = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) < len(FIELDS) or not parts[1].startswith(name_prefix):
            continue
        job_id, name, state, reason, restarts, nodes = (p.strip() for p in parts[:6])
        found[job_id] = JobState(job_id, name, state.split()[0] if state else "", reason,
                                 int(restarts) if restarts.isdigit() else 0, nodes)
    return found


def cancel(job_ids: Collection[str]) -> None:
    """scancel; a job that has ended already is no error."""
    if not job_ids:
        return
    try:
        _run(["scancel", *sorted(job_ids)], "scancel")
    except SlurmError as exc:
        logger.warning("%s", exc)


def partition_nodes(partition: str | None) -> list[str]:
    """The node names of `partition` (the default partition when None)."""
    argv = ["sinfo", "--noheader", "--Node", "--format=%N|%P"]
    if partition:
        argv.insert(1, f"--partition={partition}")
    nodes = []
    try:
        out = _run(argv, "sinfo")
    except SlurmError as exc:
        raise ConfigError(f"executor 'slurm' cannot reach the cluster ({exc}): is this a "
                          "machine of a Slurm cluster (its slurm.conf, or SLURM_CONF)?") from None
    for line in out.splitlines():
        name, _, parts = line.strip().partition("|")
        if name and (partition or parts.endswith("*")):  # sinfo marks the default with *
            nodes.append(name)
    if not nodes:
        raise ConfigError(f"Slurm partition {partition or '(the default)'!r} has no nodes "
                          "(sinfo lists none: no such partition?); name one with "
                          "--slurm-partition")
    return sorted(set(nodes))


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding `path` (the longest mount point above it)."""
    where, kind = "", "unknown"
    target = str(path.resolve())
    try:
        lines = Path("/proc/self/mountinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return kind
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(where):
            where, kind = mount, right.split()[0]
    return kind


def this_machine(node: str) -> bool:
    """Is `node` this machine (its short host name)?"""
    return node.split(".")[0] == socket.gethostname().split(".")[0]


def shared_problem(paths: Collection[Path], nodes: Collection[str]) -> str | None:
    """Why the nodes may not see `paths` (a local filesystem, other machines), or None."""
    others = [n for n in nodes if not this_machine(n)]
    if not others:
        return None  # the cluster is this machine: every path is seen
    local = [(p, filesystem_type(p)) for p in paths]
    local = [(p, kind) for p, kind in local if kind not in SHARED_FILESYSTEMS]
    if not local:
        return None
    where = ", ".join(f"{p} ({kind})" for p, kind in local)
    shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    return (f"the Slurm nodes {shown} cannot see {where}: a job runs in the run's worktree "
            "under the work dir, with this machine's interpreter, so both must be on a "
            "filesystem the nodes share (NFS, Lustre, GPFS, BeeGFS, CephFS, …); give "
            "--work-dir on one and run overnight from a virtual environment there")

