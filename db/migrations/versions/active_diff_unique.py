"""one active experiment per change: a partial unique index on (sweep_id, diff_key)

Two identical proposals posted at the same moment both passed the duplicate check (a read)
before either was inserted. The index makes the insert itself refuse the second while the
first is queued or running; finished rows keep their history (a retry or a re-run on a new
head is a new row once the old one has finished). Copies already queued by the old race are
marked rejected first (the oldest of each group is kept), or the index could not be built.

Revision ID: active_diff_unique
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "active_diff_unique"
down_revision = "0002"
branch_labels = None
depends_on = None

ACTIVE = "status IN ('queued', 'running') AND diff_key IS NOT NULL"
INDEX = "ux_experiments_active_diff"


def upgrade() -> None:
    op.execute(
        sa.text(
            "UPDATE experiments SET status = 'rejected', finished_at = CURRENT_TIMESTAMP, "
            "reason = 'duplicate of experiment ' || (SELECT MIN(o.id) FROM experiments o "
            "WHERE o.sweep_id = experiments.sweep_id AND o.diff_key = experiments.diff_key "
            f"AND o.{ACTIVE.replace(' AND ', ' AND o.')}) || ' (queued twice by a race; "
            "found by a database upgrade)' "
            f"WHERE {ACTIVE} AND id > (SELECT MIN(o.id) FROM experiments o "
            "WHERE o.sweep_id = experiments.sweep_id AND o.diff_key = experiments.diff_key "
            f"AND o.{ACTIVE.replace(' AND ', ' AND o.')})"
        )
    )
    op.create_index(INDEX, "experiments", ["sweep_id", "diff_key"], unique=True,
                    sqlite_where=sa.text(ACTIVE), postgresql_where=sa.text(ACTIVE))


def downgrade() -> None:
    op.drop_index(INDEX, table_name="experiments")
