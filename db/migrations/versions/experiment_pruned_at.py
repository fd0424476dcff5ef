"""experiments.pruned_at: when `overnight gc` removed an experiment's log files

gc keeps an old experiment's diff, metric, summary and log tail but deletes its log files and
thins its loss curve; the column says that it did (the log endpoint then says the log was
pruned) and lets the next gc skip it.

Revision ID: experiment_pruned_at
Revises: sweep_diff_index
"""

import sqlalchemy as sa
from alembic import op

revision = "experiment_pruned_at"
down_revision = "sweep_diff_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN (nullable): no table copy, whatever the table's size.
    op.add_column("experiments", sa.Column("pruned_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("pruned_at")
