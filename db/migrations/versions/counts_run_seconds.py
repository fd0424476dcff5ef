"""experiment_counts.run_s: run seconds per sweep, status and crash kind, maintained like n

The overview showed each sweep's GPU-hours by reading every experiment's run times (2.3 s at
100,000 experiments). The counts table now also sums them: a finish with both run times adds
its seconds in the same transaction as its count (db/counts.py); this fills the column from the
rows already there.

Revision ID: counts_run_seconds
Revises: experiment_parent_index
"""

import sqlalchemy as sa
from alembic import op

revision = "counts_run_seconds"
down_revision = "experiment_parent_index"
branch_labels = None
depends_on = None


def _span() -> str:
    if op.get_bind().dialect.name == "postgresql":
        return "EXTRACT(EPOCH FROM (e.run_ended_at - e.run_started_at))"
    return "(julianday(e.run_ended_at) - julianday(e.run_started_at)) * 86400.0"


def upgrade() -> None:
    op.add_column("experiment_counts",
                  sa.Column("run_s", sa.Float(), nullable=False, server_default="0"))
    span = _span()
    op.execute(
        "UPDATE experiment_counts SET run_s = COALESCE((SELECT SUM(CASE WHEN "
        f"e.run_started_at IS NOT NULL AND e.run_ended_at IS NOT NULL AND {span} > 0 THEN "
        f"{span} ELSE 0 END) FROM experiments e WHERE e.sweep_id = experiment_counts.sweep_id "
        "AND e.status = experiment_counts.status "
        "AND COALESCE(e.crash_kind, '') = experiment_counts.crash_kind), 0)")


def downgrade() -> None:
    with op.batch_alter_table("experiment_counts") as batch:
        batch.drop_column("run_s")
