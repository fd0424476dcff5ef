"""the duplicate check reads one index: (sweep_id, diff_key) replaces the diff_key index

`has_diff` (run for every POST /experiments) asks for the oldest row of a sweep with a given
diff key. With an index on diff_key alone SQLite's planner preferred (sweep_id, id) to avoid a
sort and walked every row of the sweep: the cost of a proposal grew with the sweep. On
(sweep_id, diff_key) the lookup is one index search whatever the sweep's size.

Revision ID: sweep_diff_index
Revises: keyset_pages
"""

from alembic import op

revision = "sweep_diff_index"
down_revision = "keyset_pages"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_experiments_sweep_diff", "experiments", ["sweep_id", "diff_key"])
    op.drop_index("ix_experiments_diff_key", table_name="experiments")


def downgrade() -> None:
    op.create_index("ix_experiments_diff_key", "experiments", ["diff_key"])
    op.drop_index("ix_experiments_sweep_diff", table_name="experiments")
