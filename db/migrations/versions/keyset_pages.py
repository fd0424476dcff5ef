"""pages that cost the page: keyset indexes for every list filter, maintained counts

Each list the API and dashboard offer (all, by sweep, status, crash kind and their pairs) is
read newest first with `id < cursor`; an index with the filter's columns then `id` lets it read
just the page. `experiment_counts` holds the number of experiments per sweep, status and crash
kind ("" for none), kept in step by every write (db/counts.py); it is filled here from the
rows that exist. Dialect-neutral: Alembic ops and standard SQL only.

Revision ID: keyset_pages
Revises: 0003_runs
"""

import sqlalchemy as sa
from alembic import op

revision = "keyset_pages"
down_revision = "0003_runs"
branch_labels = None
depends_on = None

CRASHED_ROWS = "crash_kind IS NOT NULL"
_FILL = """
INSERT INTO experiment_counts (sweep_id, status, crash_kind, n)
SELECT sweep_id, status, COALESCE(crash_kind, ''), COUNT(*)
FROM experiments GROUP BY sweep_id, status, COALESCE(crash_kind, '')
"""


def upgrade() -> None:
    op.create_index("ix_experiments_status_id", "experiments", ["status", "id"])
    op.create_index("ix_experiments_sweep_status", "experiments", ["sweep_id", "status", "id"])
    op.create_index("ix_experiments_crash", "experiments", ["crash_kind", "id"],
                    sqlite_where=sa.text(CRASHED_ROWS), postgresql_where=sa.text(CRASHED_ROWS))
    op.create_index("ix_experiments_sweep_crash", "experiments",
                    ["sweep_id", "crash_kind", "id"],
                    sqlite_where=sa.text(CRASHED_ROWS), postgresql_where=sa.text(CRASHED_ROWS))
    op.create_table(
        "experiment_counts",
        sa.Column("sweep_id", sa.Integer().with_variant(sa.BigInteger(), "postgresql"),
                  nullable=False),  # 64-bit like sweeps.id (migration 0001)
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("crash_kind", sa.String(length=20), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("sweep_id", "status", "crash_kind"),
    )
    op.execute(sa.text(_FILL))


def downgrade() -> None:
    op.drop_table("experiment_counts")
    for name in ("ix_experiments_sweep_crash", "ix_experiments_crash",
                 "ix_experiments_sweep_status", "ix_experiments_status_id"):
        op.drop_index(name, table_name="experiments")
