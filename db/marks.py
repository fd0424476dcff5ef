"""A sweep's runs with only the fields its evidence and the keep decisions need.

A sweep page with 10,000 experiments cannot afford full rows (diffs, summaries, logs, five
timestamps each): these read a handful of columns as plain tuples, without ORM objects, and
build the domain records from them.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import Select, select

from agent.core.domain import Run, RunRole, RunStatus
from db.models import ExperimentRow, RunCountRow, RunRow
from db.session import StoreBase

E, R, N = ExperimentRow, RunRow, RunCountRow
# Enum(value) is a slow call; 30,000 of them were a third of a 10,000-experiment page.
ROLE = {r.value: r for r in RunRole}
RUN_STATUS = {r.value: r for r in RunStatus}


def newer_rows(q: Any, sweep_id: int, after_id: int | None, ids: Collection[int],
           key: Any, ident: Any) -> list[Select[Any]]:
    """The statements reading the sweep's rows with id > after_id (all without it) and the
    rows `ids`: one index range each (sweep, id) and one primary-key lookup, never a scan."""
    if after_id is None and not ids:
        return [q.where(key == sweep_id).order_by(ident)]
    out = [] if after_id is None else [q.where(key == sweep_id, ident > after_id)
                                       .order_by(ident)]
    if ids:
        out.append(q.where(ident.in_(sorted(ids)), key == sweep_id).order_by(ident))
    return out


def read_rows(s: Any, statements: list[Select[Any]]) -> list[Any]:
    if len(statements) == 1:
        return list(s.execute(statements[0]))
    rows = {row[0]: row for q in statements for row in s.execute(q)}  # an id in both: once
    return [rows[i] for i in sorted(rows)]


class SweepMarks(StoreBase):

    def run_metrics(self, sweep_id: int, after_id: int | None = None,
                    ids: Collection[int] = ()) -> list[Run]:
        """The sweep's runs by id with id, experiment, commit, seed, role, status, metric,
        throughput (and its source), device, pair and note only (what the sweep's evidence and
        each keep decision are computed from).
        With `after_id` or `ids`: only those after it and those."""
        statements = newer_rows(select(R.id, R.experiment_id, R.commit, R.seed, R.role, R.status,
                                   R.metric, R.throughput, R.throughput_source, R.device,
                                   R.pair_run_id, R.note), sweep_id, after_id, ids,
                                R.sweep_id,
                            R.id)
        with self.session("reading a sweep's run metrics") as s:
            rows = read_rows(s, statements)
        return [Run(id=i, sweep_id=sweep_id, experiment_id=e, commit=c, seed=sd,
                    role=ROLE[role], status=RUN_STATUS[st], metric=m, throughput=t,
                    throughput_source=src, device=dev, pair_run_id=pair, note=note)
                for i, e, c, sd, role, st, m, t, src, dev, pair, note in rows]
