"""an index on experiments.parent_id: an experiment page finds its retries without the sweep

The experiment page listed "retried as" links by reading every experiment of the sweep and
keeping those whose parent it was. A partial index on (parent_id, id) over the rows that have a
parent (retries are few) makes it one index search.

Revision ID: experiment_parent_index
Revises: experiment_pruned_at
"""

import sqlalchemy as sa
from alembic import op

revision = "experiment_parent_index"
down_revision = "experiment_pruned_at"
branch_labels = None
depends_on = None

HAS_PARENT = "parent_id IS NOT NULL"


def upgrade() -> None:
    op.create_index("ix_experiments_parent", "experiments", ["parent_id", "id"],
                    sqlite_where=sa.text(HAS_PARENT), postgresql_where=sa.text(HAS_PARENT))


def downgrade() -> None:
    op.drop_index("ix_experiments_parent", table_name="experiments")
