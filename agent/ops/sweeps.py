"""Sweep-level operations shared by the CLI, the loop and the API: create a sweep, link its
assets, the proposer's context (admission is agent.ops.admission).

Uses the Store and Repo ports only; no SQL, no HTTP.
"""

from __future__ import annotations

import logging
import re
import shlex
from datetime import datetime
from pathlib import Path

from agent.core.config import CONFIG_FILE, TargetConfig, load_config
from agent.core.domain import Experiment, ExperimentStatus, Proposal, Sweep, utcnow
from agent.core.errors import ConfigError
from agent.core.ports import ProposalContext, Repo, Store, SweepSpec
from agent.git.filehash import MISSING, hash_paths
from runner.sandbox import bwrap_path

logger = logging.getLogger(__name__)
BRANCH_PREFIX = "overnight/"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
BASELINE_DESCRIPTION = "baseline"
PROGRAM_FILE = "program.md"


def check_sweep_name(name: str) -> str:
    if not _SAFE_NAME.match(name or "") or ".." in name or name.endswith((".lock", ".")):
        raise ConfigError(
            f"sweep name {name!r} is not a safe git ref name: use letters, digits, '.', '_' or '-'"
            " (up to 64, starting with a letter or digit)"
        )
    return name


def default_sweep_name(store: Store, now: datetime | None = None, prefix: str = "") -> str:
    """A date tag such as 'nov29' (after `prefix`), made unique with a suffix ('nov29-2')."""
    base = prefix + (now or utcnow()).strftime("%b%d").lower()
    taken = {s.name for s in store.list_sweeps()}
    if base not in taken:
        return base
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


def check_checkout(repo: Repo, target: Path, config: TargetConfig, name: str,
                   allow_dirty: bool) -> None:
    """Refuse what would make every run of the sweep wrong: a sandbox that cannot start, or
    uncommitted changes a run would silently ignore (unless `allow_dirty`)."""
    if config.sandbox == "bwrap" and bwrap_path() is None:
        raise ConfigError("sandbox: 'bwrap' needs bubblewrap installed (Debian: apt-get install "
                          "bubblewrap), or set sandbox = \"none\"")
    dirty = dirty_files(repo, config)
    if dirty and not allow_dirty:
        raise ConfigError(dirty_message(target.resolve(), dirty))
    if dirty:
        logger.warning("sweep %s runs the committed HEAD; uncommitted changes are NOT run: %s",
                       name, ", ".join(dirty))


def watched_hashes(repo: Repo, target: Path, head: str, config: TargetConfig) -> dict[str, str]:
    """Hashes of the protected files at `head` and of the assets on disk, checked after every
    run. Raises ConfigError when one is missing."""
    hashes = repo.file_hashes(head, config.protected)
    missing = [p for p, h in hashes.items() if h == MISSING]
    if missing:
        raise ConfigError(f"protected: {', '.join(missing)} not found in the target at {head[:7]}")
    hashes.update(asset_hashes(repo, target, head, config))
    return hashes


def create_sweep(
    store: Store,
    repo: Repo,
    target: Path,
    *,
    name: str,
    proposer: str = "knobs",
    config: TargetConfig | None = None,
    max_experiments: int | None = None,
    deadline: datetime | None = None,
    window: dict[str, str] | None = None,
    start: str = "HEAD",
    allow_dirty: bool = False,
) -> Sweep:
    """Create the sweep row and its branch `overnight/<name>`, and queue the baseline.

    Refuses a checkout with uncommitted changes (runs use committed files only) unless
    `allow_dirty`. Raises ConfigError naming the problem; nothing is created then.
    """
    check_sweep_name(name)
    config = config or load_config(target)
    check_checkout(repo, Path(target), config, name, allow_dirty)
    branch = BRANCH_PREFIX + name
    ref = f"refs/heads/{branch}"
    head = repo.head(ref if repo.has_ref(ref) else start)
    hashes = watched_hashes(repo, Path(target), head, config)
    head = repo.ensure_branch(branch, head)
    sweep = store.create_sweep(
        SweepSpec(
            name=name,
            target_path=str(Path(target).resolve()),
            branch=branch,
            proposer=proposer,
            config=config,
            max_experiments=max_experiments,
            deadline=deadline,
            window=window,
            protected_hashes=hashes,
        )
    )
    store.add_experiment(
        sweep.id,
        Proposal(description=BASELINE_DESCRIPTION, diff="", proposer="baseline"),
        is_baseline=True,
        priority=100,
        base_commit=head,
    )
    logger.info("sweep %s created on %s at %s", name, branch, head[:7])
    return sweep


def requeue_baseline(store: Store, repo: Repo, sweep: Sweep) -> Experiment | None:
    """Queue the baseline again when it never finished (interrupted, cancelled or crashed
    before giving a metric) and none is queued or running: without it every later change would
    be judged against nothing. Returns the new baseline row, or None when not needed."""
    if sweep.baseline_metric is not None:
        return None
    active = [ExperimentStatus.QUEUED, ExperimentStatus.RUNNING]
    if store.count_experiments(sweep.id, active, is_baseline=True):
        return None
    return store.add_experiment(
        sweep.id,
        Proposal(description=BASELINE_DESCRIPTION, diff="", proposer="baseline"),
        is_baseline=True,
        priority=100,
        base_commit=repo.head(sweep.branch),
    )


def dirty_files(repo: Repo, config: TargetConfig) -> list[str]:
    """Uncommitted changes a run would silently ignore: tracked files, and untracked files
    among the editable/protected ones (other untracked files, such as outputs, are ignored)."""
    named = set(config.editable) | set(config.protected)
    # overnight.toml itself is read from the checkout, so an edit to it is in effect already.
    return [path for code, path in repo.uncommitted()
            if path != CONFIG_FILE and (code != "??" or path in named)]


def dirty_message(target: Path, files: list[str]) -> str:
    listed = " ".join(shlex.quote(f) for f in files)
    return (f"{target} has uncommitted changes that a run would not see (runs use committed "
            f"files only): {', '.join(files)}. Commit them with:  git -C "
            f"{shlex.quote(str(target))} add -- {listed} && git -C {shlex.quote(str(target))} "
            "commit -m 'before overnight'   (or pass --allow-dirty to run HEAD anyway)")


def asset_hashes(repo: Repo, target: Path, head: str, config: TargetConfig) -> dict[str, str]:
    """Check `workdir` and `assets` against the target; the assets' hashes. Raises ConfigError."""
    workdir = config.workdir
    if workdir != "." and repo.file_hashes(head, [workdir])[workdir] == MISSING:
        raise ConfigError(f"workdir: {config.workdir} not found in the target at {head[:7]}")
    relative = [a for a in config.assets if not Path(a).is_absolute()]
    tracked = [a for a, h in repo.file_hashes(head, relative).items() if h != MISSING]
    if tracked:
        raise ConfigError(f"assets: {', '.join(tracked)} is committed in git; assets are files "
                          "outside git (list a committed folder in `protected` instead)")
    hashes = hash_paths(target.resolve(), config.assets)
    absent = [a for a, h in hashes.items() if h == MISSING]
    if absent:
        where = ", ".join(str(target.resolve() / a) for a in absent)
        raise ConfigError(f"assets: {', '.join(absent)} not found (looked for {where}); an asset "
                          "is a file or folder outside git that every run can read")
    return hashes


def link_assets(worktree: Path, target: Path, config: TargetConfig) -> list[Path]:
    """Make the relative assets appear in a worktree at the same paths (symlinks); the links."""
    links = []
    for asset in config.assets:
        if Path(asset).is_absolute():
            continue  # an absolute path reads the same from every worktree
        link = worktree / asset
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(target).resolve() / asset)
        links.append(link)
    return links


def read_program(sweep: Sweep) -> str:
    """The target's program.md (the agent rules), or '' when it has none."""
    path = Path(sweep.target_path) / PROGRAM_FILE
    try:
        return path.read_text(encoding="utf-8") if path.is_file() else ""
    except OSError:
        return ""


def proposal_context(store: Store, repo: Repo, sweep: Sweep) -> ProposalContext:
    config = sweep.config
    head = repo.head(sweep.branch)
    files = {p: repo.read_file(head, p) for p in config.editable}
    program = read_program(sweep)
    history = store.list_experiments(sweep.id)
    tokens_in, tokens_out, usd = store.llm_usage(sweep.id)
    return ProposalContext(sweep=sweep, files=files, history=history, program=program,
                           llm_tokens=tokens_in + tokens_out, llm_usd=usd)
