"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 20:04:22.588063
"""

import sqlalchemy as sa
from alembic import op

# JSON is text on PostgreSQL: Python's json writes NaN and Infinity (a diverged run's summary),
# which PostgreSQL's json type refuses; SQLite stores the same text (db.models.JsonText).
JSON = sa.JSON().with_variant(sa.Text(), "postgresql")
# Ids, references and token sums are 64-bit, as SQLite's INTEGER is (the API accepts ids up
# to 2^63 - 1); PostgreSQL's integer would stop at 2^31 - 1 and refuse larger lookups.
BIG = sa.Integer().with_variant(sa.BigInteger(), "postgresql")

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "sweeps",
        sa.Column("id", BIG, nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("target_path", sa.Text(), nullable=False),
        sa.Column("branch", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("proposer", sa.String(length=100), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("protected_hashes", JSON, nullable=False),
        sa.Column("max_experiments", sa.Integer(), nullable=True),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("min_delta", sa.Float(), nullable=False),
        sa.Column("deadline", sa.DateTime(), nullable=True),
        sa.Column("window", JSON, nullable=True),
        sa.Column("baseline_metric", sa.Float(), nullable=True),
        sa.Column("best_metric", sa.Float(), nullable=True),
        sa.Column("best_commit", sa.String(length=64), nullable=True),
        sa.Column("best_experiment_id", BIG, nullable=True),
        sa.Column("llm_tokens_in", BIG, nullable=False),
        sa.Column("llm_tokens_out", BIG, nullable=False),
        sa.Column("llm_usd", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sweeps_status"), ["status"], unique=False)

    op.create_table(
        "experiments",
        sa.Column("id", BIG, nullable=False),
        sa.Column("sweep_id", BIG, nullable=False),
        sa.Column("parent_id", BIG, nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("is_baseline", sa.Boolean(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("proposer", sa.String(length=100), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("diff", sa.Text(), nullable=False),
        sa.Column("diff_key", sa.String(length=64), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("crash_kind", sa.String(length=20), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("base_commit", sa.String(length=64), nullable=True),
        sa.Column("commit", sa.String(length=64), nullable=True),
        sa.Column("ref", sa.String(length=300), nullable=True),
        sa.Column("metric", sa.Float(), nullable=True),
        sa.Column("best_before", sa.Float(), nullable=True),
        sa.Column("summary", JSON, nullable=False),
        sa.Column("meta", JSON, nullable=False),
        sa.Column("log_path", sa.Text(), nullable=True),
        sa.Column("log_tail", sa.Text(), nullable=True),
        sa.Column("pgid", sa.Integer(), nullable=True),
        sa.Column("llm_tokens_in", BIG, nullable=False),
        sa.Column("llm_tokens_out", BIG, nullable=False),
        sa.Column("llm_usd", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("run_started_at", sa.DateTime(), nullable=True),
        sa.Column("run_ended_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["parent_id"],
            ["experiments.id"],
        ),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_experiments_diff_key"), ["diff_key"], unique=False)
        batch_op.create_index("ix_experiments_queue", ["status", "priority", "id"], unique=False)
        batch_op.create_index("ix_experiments_sweep_id", ["sweep_id", "id"], unique=False)

    op.create_table(
        "loss_points",
        sa.Column("id", BIG, nullable=False),
        sa.Column("experiment_id", BIG, nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=False),
        sa.Column("elapsed_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("loss_points", schema=None) as batch_op:
        batch_op.create_index("ix_loss_points_experiment", ["experiment_id", "step"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("loss_points", schema=None) as batch_op:
        batch_op.drop_index("ix_loss_points_experiment")

    op.drop_table("loss_points")
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.drop_index("ix_experiments_sweep_id")
        batch_op.drop_index("ix_experiments_queue")
        batch_op.drop_index(batch_op.f("ix_experiments_diff_key"))

    op.drop_table("experiments")
    with op.batch_alter_table("sweeps", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sweeps_status"))

    op.drop_table("sweeps")
