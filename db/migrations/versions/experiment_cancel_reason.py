"""experiments.cancel_reason: a cancel requested while the experiment runs, recorded at once

A cancel of a running experiment is answered 202 only after this is written, so a service
that dies before the run stops still ends it `cancelled` on restart (not re-queued).

Revision ID: experiment_cancel_reason
Revises: experiment_crash_cause
"""

import sqlalchemy as sa
from alembic import op

revision = "experiment_cancel_reason"
down_revision = "experiment_crash_cause"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("experiments", sa.Column("cancel_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("cancel_reason")
