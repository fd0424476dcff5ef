"""`overnight gc`: prune old experiments' logs, loss points and leftover worktrees, VACUUM
where it pays, and report the bytes stored per experiment before and after.

Registers its command on `overnight.cli_common.app` when imported (overnight.cli imports it).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from enum import Enum
from typing import Annotated, Any

import typer

from agent.core.errors import ConfigError, StoreError
from agent.ops.retention import (
    LOSS_POINTS_KEPT,
    GcReport,
    RetentionPolicy,
    collect_garbage,
    parse_age,
    parse_statuses,
    tree_bytes,
)
from db.maintenance import checkpoint, database_size, is_sqlite, vacuum, vacuum_pays
from overnight.cli_common import DbOpt, app, console, fail, runtime_for
from overnight.runtime import Runtime


class VacuumMode(str, Enum):
    AUTO = "auto"  # when enough of the file is free pages
    ALWAYS = "always"
    NEVER = "never"


def storage(runtime: Runtime) -> dict[str, Any]:
    """Bytes on disk now: the database (per table where known), logs, worktrees; per
    experiment."""
    checkpoint(runtime.engine)
    db = database_size(runtime.engine)
    work = runtime.work_dir
    logs, worktrees = tree_bytes(work / "logs"), tree_bytes(work / "worktrees")
    experiments = runtime.store.count_experiments()
    total = db.total_bytes + logs + worktrees
    return {"experiments": experiments, "database_bytes": db.total_bytes,
            "free_bytes": db.free_bytes, "tables": db.tables, "log_bytes": logs,
            "worktree_bytes": worktrees, "total_bytes": total,
            "bytes_per_experiment": round(total / experiments) if experiments else 0}


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _print_storage(label: str, s: dict[str, Any]) -> None:
    tables = ", ".join(f"{k} {human(v)}" for k, v in sorted(s["tables"].items(),
                                                           key=lambda kv: -kv[1])[:4])
    console.print(f"{label}: {s['experiments']} experiments; database {human(s['database_bytes'])}"
                  f"{f' ({tables})' if tables else ''}, logs {human(s['log_bytes'])}, worktrees "
                  f"{human(s['worktree_bytes'])} → {human(s['bytes_per_experiment'])} per "
                  "experiment", soft_wrap=True)


def _print_report(r: GcReport, policy: RetentionPolicy, older_than: str) -> None:
    verb = "would prune" if r.dry_run else "pruned"
    kept = ", ".join(sorted(s.value for s in policy.keep_logs_of)) or "none"
    console.print(f"gc (finished over {older_than} ago; logs kept for: {kept}): {verb} "
                  f"{r.experiments} experiments: {r.log_files} log files "
                  f"({human(r.log_bytes)}), {r.loss_points_removed} loss points, "
                  f"{r.worktrees} leftover worktrees ({human(r.worktree_bytes)})", soft_wrap=True)
    for line in r.skipped[:10]:
        console.print(f"  left alone: {line}", soft_wrap=True)


def _vacuum(runtime: Runtime, mode: VacuumMode, dry_run: bool) -> str:
    """Run VACUUM if asked and it pays; a sentence saying what happened."""
    if not is_sqlite(runtime.engine):
        return "VACUUM: not run on PostgreSQL (autovacuum reuses freed space in place)"
    checkpoint(runtime.engine)
    size = database_size(runtime.engine)
    pays = vacuum_pays(size)
    if mode is VacuumMode.NEVER or (mode is VacuumMode.AUTO and not pays):
        return f"VACUUM: not run ({human(size.free_bytes)} free in the file)"
    if dry_run:
        return f"VACUUM: would run ({human(size.free_bytes)} free in the file)"
    try:
        vacuum(runtime.engine)
    except StoreError as exc:
        return f"VACUUM: not run ({exc})"
    after = database_size(runtime.engine)
    return f"VACUUM: database {human(size.total_bytes)} → {human(after.total_bytes)}"


@app.command()
def gc(
    db: DbOpt = None,
    older_than: Annotated[str, typer.Option(help="prune experiments finished longer ago than "
                                            "this: 30s, 90m, 12h, 7d, 2w")] = "7d",
    keep_logs_of: Annotated[str, typer.Option(help="statuses whose logs and curves are kept "
                                              "whole, comma-separated, or none")] = "kept",
    loss_points: Annotated[int, typer.Option(min=0, help="points kept of each pruned loss "
                                             "curve")] = LOSS_POINTS_KEPT,
    vacuum_mode: Annotated[VacuumMode, typer.Option("--vacuum", help="rewrite the SQLite file "
                                                    "without its free pages: auto = when it "
                                                    "pays")] = VacuumMode.AUTO,
    dry_run: Annotated[bool, typer.Option(help="report what would go; change nothing")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the figures as JSON")] = False,
) -> None:
    """Prune old experiments' logs, loss points and leftover worktrees; keep their diffs,
    metrics, summaries, log tails and git refs. Queued and running ones are never touched."""
    try:
        policy = RetentionPolicy(parse_age(older_than), parse_statuses(keep_logs_of),
                                 loss_points)
    except ConfigError as exc:
        fail(str(exc))
    runtime = runtime_for(db)
    before = storage(runtime)
    report = collect_garbage(runtime.store, runtime.repo_for, runtime.work_dir, policy,
                             dry_run=dry_run)
    vacuumed = _vacuum(runtime, vacuum_mode, dry_run)
    after = storage(runtime)
    if as_json:
        typer.echo(json.dumps({"before": before, "gc": asdict(report), "vacuum": vacuumed,
                               "after": after}))
        return
    _print_storage("storage before", before)
    _print_report(report, policy, older_than)
    console.print(vacuumed)
    if not dry_run:
        _print_storage("storage after", after)
