"""The Ray executor: each run as a Ray task on an existing cluster; the coordinator keeps the rest.

`RayExecutor` connects to a cluster (`executor = "ray"`, `ray_address`) and hands out one
`RayRunner` per loop: the Runner port (agent.core.ports), so agent.engine.loop and
agent.engine.attempt run a remote run exactly like a local one. The coordinator keeps the database,
git and decisions; a run ships its commit as a git bundle through the object store to a task that
asks for `num_gpus` (1 by default) and runs it with the same runner on the worker
(agent.executors.remote_run). Log lines come back through a small channel actor on the coordinator's
node, and go to the local log file and the same line callback (the loss curve) as a local run.

Guaranteed: Ray never retries a run by itself (max_retries=0): a task whose worker or node
died raises WorkerLostError, which the loop records `interrupted` and re-queues once. A run that
no node alive can hold (its GPUs, CPUs and resources, against each node's totals) is not
submitted: RunNotStartedError says which resource is short and the fix. A stop
is first asked of the worker (the runner ends the whole process tree); a worker that does not
answer within the grace is force-cancelled and its node swept for the run's processes by their
OVERNIGHT_RUN_ID; the same happens to a run that overstays its deadline by `backstop_s`. No
remote pgid is ever recorded (recovery must not kill a local group of that number): when the
coordinator dies, Ray ends its tasks (tests/test_ray_executor.py checks that nothing of the run
is left). Not guaranteed: that a sweep reaches a node that is gone (its processes went with it).
Ray is imported lazily: the coordinator installs and runs without it.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent.core.domain import Sweep
from agent.core.errors import ConfigError, RunNotStartedError
from agent.executors.ray_follow import Follow, Link
from agent.executors.remote_run import RemoteOutcome, RemoteRequest, local_result, run_remote
from runner.result import RunResult

logger = logging.getLogger(__name__)

RAY_MISSING = "executor 'ray' needs Ray on the coordinator: pip install 'overnight[ray]'"


@dataclass(frozen=True)
class RaySettings:
    address: str | None = None  # None: the cluster this machine belongs to ("auto")
    num_gpus: float = 1.0  # what one run asks of the cluster
    num_cpus: float = 1.0
    resources: dict[str, float] = field(default_factory=dict)  # custom resources, per run
    grace_s: float = 5.0  # SIGTERM → SIGKILL on the worker
    stop_wait_s: float = 20.0  # after grace: a worker that has not ended the run is killed
    backstop_s: float = 60.0  # past timeout + grace: the task is killed from here


class RayExecutor:
    """One connection to a Ray cluster, the channel actor, and the runners of the loops."""

    def __init__(self, settings: RaySettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._ray: Any = None
        self._channel: Any = None
        self._task: Any = None
        self._connected_here = False

    def connect(self) -> Any:
        """Join the cluster once (ConfigError naming the address if it cannot be reached)."""
        with self._lock:
            if self._ray is None:
                self._ray, self._connected_here = _join(self.settings.address)
                self._setup()
            return self._ray

    def _setup(self) -> None:
        ray, s = self._ray, self.settings
        self._channel = self._new_channel()
        # max_calls=0: the worker process is reused (the run is a child process anyway).
        self._task = ray.remote(max_calls=0, max_retries=0, retry_exceptions=False)(
            _remote_task).options(num_gpus=s.num_gpus, num_cpus=s.num_cpus,
                                  resources=dict(s.resources) or None)

    def _new_channel(self) -> Any:
        """The channel actor, on this machine's node when it is one (it lives as long as we
        do; a worker node that dies must not take it along)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = self._ray.get_runtime_context().get_node_id()
        strategy = NodeAffinitySchedulingStrategy(here, soft=False) if here else "DEFAULT"
        return self._ray.remote(Channel).options(num_cpus=0, scheduling_strategy=strategy).remote()

    def channel(self, dead: Any = None) -> Any:
        """The channel actor; a new one when `dead` (the current one's node went away)."""
        with self._lock:
            if dead is not None and dead is self._channel:
                logger.warning("the runs' channel actor died; starting a new one")
                self._channel = self._new_channel()
            return self._channel

    def link(self) -> Link:
        """What following one task needs: ray, the task, the channel and a way to renew it."""
        ray = self.connect()
        return Link(ray, self._task, self.channel(), self.channel, self.settings.grace_s,
                    self.settings.stop_wait_s, self.settings.backstop_s)

    def unfit(self) -> str | None:
        """Why no node of the cluster can hold a run (one sentence, with the fix), or None."""
        ray = self.connect()
        return unfit([n.get("Resources") or {} for n in ray.nodes() if n.get("Alive")],
                     self.settings)

    def runner(self, sweep: Sweep, expected: Callable[[], Mapping[str, str]]) -> RayRunner:
        """The Runner of one loop of `sweep`; `expected` gives the watched files' hashes."""
        config = sweep.config
        if config.sandbox == "bwrap":
            raise ConfigError("sandbox = 'bwrap' is not supported with executor 'ray' yet; "
                              "run this target with the local executor")
        self.connect()
        return RayRunner(self, sweep, expected)

    def close(self) -> None:
        with self._lock:
            if self._ray is not None and self._connected_here:
                self._ray.shutdown()
            self._ray = self._channel = self._task = None


def unfit(nodes: Sequence[Mapping[str, float]], s: RaySettings) -> str | None:
    """Why none of `nodes` (each alive node's total resources: a busy node that fits is waited
    for) can hold a run of settings `s`, in one sentence with the fix; None when one can."""
    asked = {k: v for k, v in {"GPU": s.num_gpus, "CPU": s.num_cpus, **s.resources}.items()
             if v > 0}
    if any(all(node.get(k, 0) >= v for k, v in asked.items()) for node in nodes):
        return None
    most = {k: max((node.get(k, 0) for node in nodes), default=0) for k in asked}
    short = [k for k, v in asked.items() if most[k] < v]
    if not short:
        listed = ", ".join(f"{k}={v:g}" for k, v in asked.items())
        return (f"no single node of the Ray cluster has all a run asks for ({listed}): ask for "
                "less (--ray-gpus, --ray-cpus, --ray-resource), or join a node that has it all")
    k = short[0]
    what, fix = {
        "GPU": (f"{asked[k]:g} GPU(s)", "run with --ray-gpus 0, or join a node with GPUs"),
        "CPU": (f"{asked[k]:g} CPU(s)", "lower --ray-cpus, or join a larger node"),
    }.get(k, (f"the resource {k}={asked[k]:g}", "leave out --ray-resource, or join a node "
              "that has it (ray start --resources)"))
    return (f"no node of the Ray cluster has {what} for a run (the most a node has is "
            f"{most[k]:g}): {fix}")


class Channel:
    """Actor: the lines and stop flags of the runs in flight, by token."""

    def __init__(self) -> None:
        self.lines: dict[str, list[str]] = {}
        self.nodes: dict[str, str] = {}
        self.stops: set[str] = set()

    def started(self, token: str, node_id: str) -> None:
        self.nodes[token] = node_id

    def exchange(self, token: str, lines: list[str]) -> bool:
        self.lines.setdefault(token, []).extend(lines)
        return token in self.stops

    def take(self, token: str) -> tuple[list[str], str | None]:
        return self.lines.pop(token, []), self.nodes.get(token)

    def stop(self, token: str) -> None:
        self.stops.add(token)

    def forget(self, token: str) -> None:
        self.lines.pop(token, None)
        self.nodes.pop(token, None)
        self.stops.discard(token)


def _remote_task(request: RemoteRequest, bundle: bytes, channel: Any,
                 token: str) -> RemoteOutcome:
    """The Ray task: report the node, then agent.executors.remote_run.run_remote with the
    channel."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    channel.started.remote(token, node_id)

    def exchange(lines: list[str]) -> bool:
        return bool(ray.get(channel.exchange.remote(token, lines), timeout=30))

    node = f"{ray.util.get_node_ip_address()} (node {node_id[:8]})"  # type: ignore[no-untyped-call]
    return run_remote(request, bundle, exchange, node=node)


def cluster_slots(address: str | None, num_gpus: float, num_cpus: float) -> int:
    """How many runs the cluster holds at once: its GPUs / num_gpus (CPUs without GPUs)."""
    ray, _ = _join(address)
    total = ray.cluster_resources()
    if num_gpus:
        return max(1, int(total.get("GPU", 0) // num_gpus))
    return max(1, int(total.get("CPU", 0) // max(num_cpus, 1)))


def _join(address: str | None) -> tuple[Any, bool]:
    """The ray module, connected; and whether this call made the connection."""
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    if ray.is_initialized():
        return ray, False
    where = address or os.environ.get("RAY_ADDRESS") or "auto"
    try:
        ray.init(address=where, namespace="overnight", log_to_driver=False,
                 include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"cannot join the Ray cluster at {where}: {exc}; start one with "
                          "`ray start --head` and give its address (--ray-address)") from None
    return ray, True


class RayRunner:
    """The Runner port for one loop: each run is one Ray task (see the module docstring)."""

    def __init__(self, executor: RayExecutor, sweep: Sweep,
                 expected: Callable[[], Mapping[str, str]]) -> None:
        self.executor, self.sweep, self.expected = executor, sweep, expected

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
        """Run remotely; `on_start` and `on_submit` are never called (no local process group
        exists, no batch scheduler is involved).

        Raises WorkerLostError when the worker or its node died before reporting a result;
        RunNotStartedError, before submitting it, when no node of the cluster can hold it.
        """
        del on_start, on_submit
        why = self.executor.unfit()
        if why is not None:
            raise RunNotStartedError(why)
        wt, commit = worktree_of(cwd)
        request = self._request(argv, wt, cwd, commit, timeout_s, env, pass_env)
        follow = Follow(self.executor.link(), request, log_path, on_line, stop_event)
        outcome = follow.run(make_bundle(wt))
        if isinstance(outcome, RunResult):
            return outcome
        return self._mirror(wt, outcome, local_result(outcome.result, log_path))

    def _request(self, argv: list[str], wt: Path, cwd: Path, commit: str, timeout_s: float,
                 env: Mapping[str, str] | None, pass_env: Sequence[str]) -> RemoteRequest:
        config, s = self.sweep.config, self.executor.settings
        watched = [*config.protected, *config.assets]
        known = self.expected()
        return RemoteRequest(
            commit=commit, argv=list(argv), workdir=str(cwd.relative_to(wt)),
            timeout_s=timeout_s, env=dict(env or {}), pass_env=tuple(pass_env),
            grace_s=s.grace_s, coordinator_python=sys.executable,
            asset_root=str(Path(self.sweep.target_path).resolve()), assets=tuple(config.assets),
            expected={p: known[p] for p in watched if p in known}, cache_key=self.sweep.name)

    def _mirror(self, wt: Path, outcome: RemoteOutcome, result: RunResult) -> RunResult:
        """Watched files the worker saw changed: relative ones are marked changed in the local
        worktree (so the loop's tamper check sees them); an absolute asset fails the run."""
        foreign = []
        for rel, digest in sorted(outcome.changed.items()):
            if Path(rel).is_absolute():
                foreign.append(f"{rel} on {outcome.node} is not the coordinator's "
                               f"(hash {digest[:12]})")
                continue
            local = wt / rel
            if local.is_dir() and not local.is_symlink():
                shutil.rmtree(local)
            elif local.exists() or local.is_symlink():
                local.unlink()
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(f"changed on the Ray worker {outcome.node}: hash {digest}\n",
                             encoding="utf-8")
        if foreign:
            return replace(result, fail_marker=True, error="; ".join(foreign))
        return result


def worktree_of(cwd: Path) -> tuple[Path, str]:
    """The git worktree holding `cwd` and its checked-out commit."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True,
                              text=True).stdout.strip()

    return Path(git("rev-parse", "--show-toplevel")), git("rev-parse", "HEAD")


def make_bundle(wt: Path) -> bytes:
    """A git bundle of the worktree's HEAD (the commit and its history)."""
    with tempfile.TemporaryDirectory(prefix="overnight-bundle-") as tmp:
        path = Path(tmp) / "commit.bundle"
        subprocess.run(["git", "-C", str(wt), "bundle", "create", "--quiet", str(path), "HEAD"],
                       check=True, capture_output=True)
        return path.read_bytes()
