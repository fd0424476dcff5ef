"""SqlStore: the agent.core.ports.Store contract on SQLAlchemy 2.0 (sync sessions, short
transactions).

Finished experiments are read-only; queued → running is a guarded UPDATE so two workers
never claim the same row; every driver error surfaces as one StoreError naming the action.
"""

from __future__ import annotations

from agent.core.ports import Store
from agent.rules.admit import diff_key
from db.experiment_reads import ExperimentReads
from db.experiments import ExperimentWrites
from db.marks import SweepMarks
from db.pruning import Pruning
from db.rows import BRIEF_FIELDS, to_experiment, to_run, to_sweep
from db.runs import LossCurves, RunQueries
from db.sweeps import SweepQueries

__all__ = ["BRIEF_FIELDS", "SqlStore", "diff_key", "to_experiment", "to_run", "to_sweep"]


class SqlStore(SweepQueries, ExperimentWrites, ExperimentReads, LossCurves, RunQueries,
               SweepMarks, Pruning):
    """Every part shares StoreBase's engine and session(); each file holds one table's queries
    (runs.py: the runs and the loss points they print)."""


def _implements_the_port(store: SqlStore) -> Store:
    """mypy checks here that SqlStore has every method of the Store port."""
    return store
