"""runs.holdout: the sealed holdout metric of a target's holdout_metric

The protected harness prints it in the summary block; the service takes it out of the summary
and the logs (no proposer sees it during the night) and keeps it here for the morning report.
One plain nullable ADD COLUMN: no table copy; rows already there keep NULL. Dialect-neutral:
Alembic ops only.

Revision ID: holdout_confirm
Revises: run_blocking
"""

import sqlalchemy as sa
from alembic import op

revision = "holdout_confirm"
down_revision = "run_blocking"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("holdout", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("holdout")
