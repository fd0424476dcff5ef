"""the time filter: an index on experiments (created_at, id)

`GET /experiments?since=…&until=…` (and the dashboard's and MCP's time filter) selects rows by
`created_at`. Rows are written in id order, so a window is an id range of every listing: this
index finds each end of it in one seek (db/keyset.py), and the page then walks the filter's
existing (…, id) index. One index, written on insert only (created_at never changes).
Dialect-neutral.

Revision ID: created_index
Revises: experiment_filter_stats
"""

from alembic import op

revision = "created_index"
down_revision = "experiment_filter_stats"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_experiments_created", "experiments", ["created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_experiments_created", table_name="experiments")
