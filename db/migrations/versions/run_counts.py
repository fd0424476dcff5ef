"""run_counts: runs per sweep and status, maintained like experiment_counts; an index on runs
(sweep_id, status, id)

The dashboard reads Store.sweep_version on every sweep and experiment page view; its runs part
counted the sweep's runs per status (56 ms at 100,000 runs). Every run insert, end and verdict
flip now bumps this table in the same transaction (db/counts.py bump_runs), and each status's
highest id is one seek in the new index; this fills the table from the rows already there.
Dialect-neutral: Alembic ops and standard SQL only.

Revision ID: run_counts
Revises: created_index
"""

import sqlalchemy as sa
from alembic import op

revision = "run_counts"
down_revision = "created_index"
branch_labels = None
depends_on = None

_FILL = """
INSERT INTO run_counts (sweep_id, status, n)
SELECT sweep_id, status, COUNT(*) FROM runs GROUP BY sweep_id, status
"""


def upgrade() -> None:
    op.create_index("ix_runs_sweep_status", "runs", ["sweep_id", "status", "id"])
    op.create_table(
        "run_counts",
        sa.Column("sweep_id", sa.Integer().with_variant(sa.BigInteger(), "postgresql"),
                  nullable=False),  # 64-bit like sweeps.id (migration 0001)
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("sweep_id", "status"),
    )
    op.execute(sa.text(_FILL))


def downgrade() -> None:
    op.drop_table("run_counts")
    op.drop_index("ix_runs_sweep_status", table_name="runs")
