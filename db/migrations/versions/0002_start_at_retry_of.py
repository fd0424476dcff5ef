"""sweeps.start_at, experiments.retry_of; seed and min_delta only in the sweep's config

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 00:40:00

A sweep's scheduled start used to live in a second SQLite file of APScheduler's; it is now a
column the engine reads on start. The retry of an interrupted experiment was found by scanning
`meta["retry_of"]` in Python; it is now a column with a unique index (one retry per row),
filled from the old metadata. `seed` and `min_delta` were stored twice (columns and the
config JSON, written from the same parsed config); the config keeps them.
"""

import json

import sqlalchemy as sa
from alembic import op

# Ids, references and token sums are 64-bit, as SQLite's INTEGER is (the API accepts ids up
# to 2^63 - 1); PostgreSQL's integer would stop at 2^31 - 1 and refuse larger lookups.
BIG = sa.Integer().with_variant(sa.BigInteger(), "postgresql")

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("start_at", sa.DateTime(), nullable=True))
        batch.drop_column("seed")
        batch.drop_column("min_delta")
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("retry_of", BIG, nullable=True))
        batch.create_foreign_key("fk_experiments_retry_of", "experiments", ["retry_of"], ["id"])
        batch.create_index("ix_experiments_retry_of", ["retry_of"], unique=True)
    conn = op.get_bind()
    rows = conn.execute(sa.text(
        "SELECT id, meta FROM experiments WHERE CAST(meta AS TEXT) LIKE '%retry_of%'"
    ))
    for exp_id, meta in rows.fetchall():
        value = (json.loads(meta) if isinstance(meta, str) else meta or {}).get("retry_of")
        if isinstance(value, int):
            conn.execute(sa.text("UPDATE experiments SET retry_of = :r WHERE id = :i"),
                         {"r": value, "i": exp_id})


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_index("ix_experiments_retry_of")
        batch.drop_constraint("fk_experiments_retry_of", type_="foreignkey")
        batch.drop_column("retry_of")
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("start_at")
        batch.add_column(sa.Column("seed", sa.Integer(), nullable=False, server_default="42"))
        batch.add_column(sa.Column("min_delta", sa.Float(), nullable=False,
                                   server_default="0"))
