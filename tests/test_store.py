"""What only the SQL store has: the migrated schema (WAL, foreign keys), aware UTC times after
a round trip through SQLite. The shared contract is tests/test_store_contract.py."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import inspect, text

from agent.core.config import TargetConfig
from agent.core.domain import Proposal
from agent.core.ports import SweepSpec
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


def _migration_head() -> str:
    """The single head revision of db/migrations, read from the scripts themselves."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    import db.engine

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(db.engine.__file__).parent / "migrations"))
    heads = ScriptDirectory.from_config(cfg).get_heads()
    assert len(heads) == 1, f"several migration heads: {heads}"
    return heads[0]


def test_schema_is_migrated_with_wal(tmp_path):
    engine = open_database(tmp_path / "x.db")
    assert {"sweeps", "experiments", "loss_points", "alembic_version"} <= set(
        inspect(engine).get_table_names()
    )
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        versions = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    assert versions == [_migration_head()]  # migrated all the way, one head
    open_database(tmp_path / "x.db")  # a second open is a no-op


def test_timestamps_are_aware_utc(store: SqlStore):
    sweep = store.create_sweep(spec())
    exp = store.add_experiment(sweep.id, Proposal("a", "d"))
    assert store.get_experiment(exp.id).created_at.tzinfo is not None
    assert store.get_sweep("s").created_at.utcoffset().total_seconds() == 0
