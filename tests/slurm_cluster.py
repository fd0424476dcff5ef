"""A throw-away one-node Slurm cluster for the tests: munged, slurmctld and slurmd from Debian's
`slurm-wlm` and `munge`, configured for loopback in a temp dir, on free ports, as root.

Everything lives in the temp dir (slurm.conf, the munge key and socket, state, spool, logs,
pid files): nothing under /etc is written, and the clients find the cluster through SLURM_CONF,
which the session sets (so `overnight` subprocesses inherit it). The node is this machine, as
`slurmd -C` describes it, in partition `debug`; a second partition `faraway` holds a node that
is never up (another machine, for the shared-filesystem check). Without the binaries, or when
not root, the tests that need it skip with the reason; with OVERNIGHT_REQUIRE_SLURM=1 (set by
.ci/run) they fail instead, so CI cannot pass by skipping.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

REQUIRE_ENV = "OVERNIGHT_REQUIRE_SLURM"
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
START_TIMEOUT_S = 60.0
MUNGE_KEY = Path("/etc/munge/munge.key")  # the package's key (generated at install)

CONFIG = """\
ClusterName=overnight-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
# the loop's tests count a test's jobs with squeue: finished ones stay listed for 20 minutes
MinJobAge=1200
KillWait=10
ReturnToService=2
MpiDefault=none
{scheduler}{node_line} NodeAddr=127.0.0.1 State=UNKNOWN
NodeName=faraway-node NodeAddr=127.0.0.2 CPUs=1 State=DOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
PartitionName=faraway Nodes=faraway-node MaxTime=INFINITE State=UP
"""


def why_unavailable() -> str | None:
    """None when a cluster can be started here, else the reason it cannot."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing; ./dev.sh test installs "
                "Debian's slurm-wlm and munge when root)")
    if os.geteuid() != 0:
        return "the Slurm tests run slurmctld and slurmd as root; not root"
    if not MUNGE_KEY.is_file():
        return f"no munge key at {MUNGE_KEY} (the munge package makes one)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# A batch job is scheduled when it is submitted (Slurm's default defers it by up to 3 s).
FAST_SCHEDULING = "batch_sched_delay=0"


class SlurmCluster:
    """A running one-node cluster: `conf` (its slurm.conf), `node`, `stop()`."""

    def __init__(self, root: Path, scheduler: str | None = FAST_SCHEDULING) -> None:
        self.root, self.scheduler = root, scheduler
        self.conf = root / "slurm.conf"
        self.node = ""

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> str:
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=self.env(),
                              timeout=START_TIMEOUT_S, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {proc.stderr or proc.stdout}")
        return proc.stdout

    def start(self) -> None:
        line = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True,
                              timeout=START_TIMEOUT_S).stdout.splitlines()[0].strip()
        self.node = line.split()[0].removeprefix("NodeName=")
        for folder in ("state", "spool"):
            (self.root / folder).mkdir()
        key = self.root / "munge.key"
        shutil.copyfile(MUNGE_KEY, key)
        key.chmod(0o600)
        scheduler = f"SchedulerParameters={self.scheduler}\n" if self.scheduler else ""
        self.conf.write_text(CONFIG.format(root=self.root, node=self.node, node_line=line,
                                           ctld_port=free_port(), slurmd_port=free_port(),
                                           scheduler=scheduler))
        r = self.root
        self.run("munged", "--force", f"--key-file={key}", f"--socket={r}/munge.sock",
                 f"--pid-file={r}/munged.pid", f"--log-file={r}/munged.log",
                 f"--seed-file={r}/munge.seed")
        self.run("slurmctld", "-f", str(self.conf))
        self.run("slurmd", "-f", str(self.conf))
        deadline = time.monotonic() + START_TIMEOUT_S
        while "idle" not in self.run("sinfo", "--noheader", "--partition=debug", "-o", "%t",
                                     check=False):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Slurm node did not come up:\n{self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n" + (self.root / name).read_text(errors="replace")[-3000:]
                         for name in ("slurmctld.log", "slurmd.log", "munged.log")
                         if (self.root / name).exists())

    def stop(self) -> None:
        """Stop the daemons (slurmd and slurmctld first, munged last) and delete the folder."""
        for name in ("slurmd.pid", "slurmctld.pid", "munged.pid"):
            pid_file = self.root / name
            try:
                pid = int(pid_file.read_text().strip())
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError):
                continue
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster(scheduler: str | None = FAST_SCHEDULING) -> SlurmCluster:
    """Start a cluster; `scheduler` is its SchedulerParameters (None: Slurm's defaults)."""
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="overnight-slurm-", dir="/tmp")),
                           scheduler)
    try:
        cluster.start()
    except Exception:
        logs = cluster.logs()
        cluster.stop()
        raise RuntimeError(f"could not start Slurm:\n{logs}") from None
    return cluster
