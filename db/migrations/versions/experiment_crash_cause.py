"""experiments.crash_cause: the fine cause classification named ("CUDA out of memory")

Recorded once, when a crash is classified (agent.rules.classify), so nothing downstream parses
the reason again. Rows from before stay NULL (their reason still starts with the cause).

Revision ID: experiment_crash_cause
Revises: run_counts
"""

import sqlalchemy as sa
from alembic import op

revision = "experiment_crash_cause"
down_revision = "run_counts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN (nullable): no table copy, whatever the table's size.
    op.add_column("experiments", sa.Column("crash_cause", sa.String(100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("crash_cause")
