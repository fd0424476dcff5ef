"""runs.throughput_source, runs.pair_run_id, runs.note: the keep rule's blocking in time

Each run records where its throughput came from (a summary key or the progress lines; NULL:
unknown, so the machine's load cannot be checked), an incumbent run started beside a change's
run records that run (its same-window pair), and the keep rule's note says how a run was
placed (why it is suspect: its throughput, the reference, the source). Three plain nullable
ADD COLUMNs: no table copy, whatever the table's size; rows already there keep NULL.
Dialect-neutral: Alembic ops only.

Revision ID: run_blocking
Revises: experiment_cancel_reason
"""

import sqlalchemy as sa
from alembic import op

revision = "run_blocking"
down_revision = "experiment_cancel_reason"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("throughput_source", sa.String(length=40), nullable=True))
    op.add_column("runs", sa.Column(
        "pair_run_id", sa.Integer().with_variant(sa.BigInteger(), "postgresql"), nullable=True))
    op.add_column("runs", sa.Column("note", sa.String(length=500), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("note")
        batch.drop_column("pair_run_id")
        batch.drop_column("throughput_source")
