"""What only the SQL store has: the migrated schema (WAL, foreign keys), aware UTC times after
a round trip through SQLite. The shared contract is tests/test_store_contract.py."""

from __future__ import annotations

from sqlalchemy import inspect, text

from agent.config import TargetConfig
from agent.domain import Proposal
from agent.ports import SweepSpec
from db.engine import open_database
from db.store import SqlStore


def spec(name="s"):
    return SweepSpec(
        name=name,
        target_path="/t",
        branch=f"overnight/{name}",
        proposer="knobs",
        config=TargetConfig(command="python train.py", editable=("train.py",),
                            metric="val_bpb", budget_s=1, timeout_s=5),
    )


def test_schema_is_migrated_with_wal(tmp_path):
    engine = open_database(tmp_path / "x.db")
    assert {"sweeps", "experiments", "loss_points", "alembic_version"} <= set(
        inspect(engine).get_table_names()
    )
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert (
            conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0001"
            or conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        )
    open_database(tmp_path / "x.db")  # a second open is a no-op


def test_timestamps_are_aware_utc(store: SqlStore):
    sweep = store.create_sweep(spec())
    exp = store.add_experiment(sweep.id, Proposal("a", "d"))
    assert store.get_experiment(exp.id).created_at.tzinfo is not None
    assert store.get_sweep("s").created_at.utcoffset().total_seconds() == 0
