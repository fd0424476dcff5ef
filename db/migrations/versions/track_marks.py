"""track_sweeps, track_experiments: what an experiment tracker (MLflow, W&B) holds of a sweep

The mirror's ledger: per sweep and tracker (its destination, no secret), the parent run, whether
it was ended and the error the last sync stopped on; per experiment its child run and the
verdict it was sent. Two new tables: nothing else changes. Dialect-neutral: Alembic ops only.

Revision ID: track_marks
Revises: run_pruning
"""

import sqlalchemy as sa
from alembic import op

revision = "track_marks"
down_revision = "run_pruning"
branch_labels = None
depends_on = None

BIG = sa.Integer().with_variant(sa.BigInteger(), "postgresql")
JSON = sa.JSON().with_variant(sa.Text(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "track_sweeps",
        sa.Column("sweep_id", BIG, sa.ForeignKey("sweeps.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("destination", sa.String(length=300), primary_key=True),
        sa.Column("remote_id", sa.String(length=200), nullable=True),
        sa.Column("closed", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("failing_since", sa.DateTime(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "track_experiments",
        sa.Column("sweep_id", BIG, sa.ForeignKey("sweeps.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("destination", sa.String(length=300), primary_key=True),
        sa.Column("experiment_id", BIG, sa.ForeignKey("experiments.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("remote_id", sa.String(length=200), nullable=False),
        sa.Column("sent", JSON, nullable=False),
        sa.Column("mirrored_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("track_experiments")
    op.drop_table("track_sweeps")
