"""runs.curve: each run's loss by fraction of the training budget, for the early stop

A change's run is judged while it trains against the incumbent's runs at the same fraction of
the budget (agent.rules.prune), so each run keeps its own curve: a few hundred
[fraction, loss, step] points as JSON (text on PostgreSQL, like runs.summary). A plain nullable
ADD COLUMN: no table copy; runs already there keep NULL (no curve: not used as a reference).
A pruned run is the new run status `pruned` (a string column: no schema change; run_counts
counts it like the others). Dialect-neutral: Alembic ops only.

Revision ID: run_pruning
Revises: holdout_confirm
"""

import sqlalchemy as sa
from alembic import op

revision = "run_pruning"
down_revision = "holdout_confirm"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("curve", sa.JSON().with_variant(sa.Text(), "postgresql"),
                                    nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("curve")
