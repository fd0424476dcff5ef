"""PostgreSQL: joint statistics on (sweep_id, status, crash_kind), so filters are estimated
together

The planner multiplies the selectivities of `status = 'kept'` (~5 %) and `crash_kind =
'fundamental'` (~8 %) as if they were independent and expects a match every ~250 rows, so it
walks the primary key from the newest row, filtering, and reads the whole table when nothing
matches (a kept row never has a crash kind). A multi-column MCV list tells it which
combinations occur; it then reads the matching index range instead. SQLite has no such
statistics object and its planner already prefers the equality index: a no-op there.

Revision ID: experiment_filter_stats
Revises: counts_run_seconds
"""

from alembic import op

revision = "experiment_filter_stats"
down_revision = "counts_run_seconds"
branch_labels = None
depends_on = None

NAME = "st_experiments_filters"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"CREATE STATISTICS IF NOT EXISTS {NAME} (mcv) "
               "ON sweep_id, status, crash_kind FROM experiments")
    op.execute("ANALYZE experiments")  # the new statistics exist only once analysed


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP STATISTICS IF EXISTS {NAME}")
