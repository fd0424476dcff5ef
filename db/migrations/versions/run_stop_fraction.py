"""runs.stop_fraction: the share of its budget at which an early stop ended a run

Where the early stop ended a run was only said in its note's words; screens and recovery read it
from this column instead of parsing the sentence back. A plain nullable ADD COLUMN: runs already
there keep NULL (a pruned one is then placed at its curve's end). Dialect-neutral.

Revision ID: run_stop_fraction
Revises: run_slurm_job
"""

import sqlalchemy as sa
from alembic import op

revision = "run_stop_fraction"
down_revision = "run_slurm_job"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("stop_fraction", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("stop_fraction")
