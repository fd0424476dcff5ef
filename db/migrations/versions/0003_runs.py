"""runs: every execution of a commit's script as its own record

Revision ID: 0003_runs
Revises: active_diff_unique
Create Date: 2026-11-30 01:05:00

Existing experiments that ran get one run each (role baseline or screen), so their results,
process groups and logs stay reachable through the new table; nothing is dropped.
"""

import sqlalchemy as sa
from alembic import op

# Ids, references and token sums are 64-bit, as SQLite's INTEGER is (the API accepts ids up
# to 2^63 - 1); PostgreSQL's integer would stop at 2^31 - 1 and refuse larger lookups.
BIG = sa.Integer().with_variant(sa.BigInteger(), "postgresql")

revision = "0003_runs"
down_revision = "active_diff_unique"
branch_labels = None
depends_on = None

# `{seed}`, `{training}`, `{total}`: the JSON reads in each dialect (text JSON on PostgreSQL).
_BACKFILL = """
INSERT INTO runs (sweep_id, experiment_id, "commit", seed, role, status, metric, summary,
                  training_s, total_s, pgid, log_path, started_at, ended_at)
SELECT e.sweep_id, e.id, e."commit", COALESCE({seed}, 42),
       CASE WHEN e.is_baseline THEN 'baseline' ELSE 'screen' END,
       CASE e.status
            WHEN 'kept' THEN 'ok' WHEN 'discarded' THEN 'ok'
            WHEN 'timeout' THEN 'timeout' WHEN 'cancelled' THEN 'cancelled'
            WHEN 'interrupted' THEN 'interrupted' WHEN 'running' THEN 'running'
            ELSE 'failed' END,
       e.metric, e.summary, {training}, {total},
       e.pgid, e.log_path, e.run_started_at, e.run_ended_at
FROM experiments e JOIN sweeps s ON s.id = e.sweep_id
WHERE e.run_started_at IS NOT NULL AND e."commit" IS NOT NULL
ORDER BY e.id
"""
# PostgreSQL's json refuses the NaN/Infinity that Python writes (a diverged run's summary):
# those tokens read as null there.
_PG_SUMMARY = r"CAST(regexp_replace(e.summary, '-?\m(NaN|Infinity)\M', 'null', 'g') AS json)"
_JSON_READS = {
    "sqlite": {"seed": "json_extract(s.config, '$.seed')",
               "training": "json_extract(e.summary, '$.training_seconds')",
               "total": "json_extract(e.summary, '$.total_seconds')"},
    "postgresql": {"seed": "CAST(CAST(s.config AS json) ->> 'seed' AS integer)",
                   "training": f"CAST({_PG_SUMMARY} ->> 'training_seconds' AS float)",
                   "total": f"CAST({_PG_SUMMARY} ->> 'total_seconds' AS float)"},
}


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", BIG, nullable=False),
        sa.Column("sweep_id", BIG, nullable=False),
        sa.Column("experiment_id", BIG, nullable=False),
        sa.Column("commit", sa.String(length=64), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=20), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("metric", sa.Float(), nullable=True),
        sa.Column("summary", sa.JSON().with_variant(sa.Text(), "postgresql"),
                  nullable=False),
        sa.Column("throughput", sa.Float(), nullable=True),
        sa.Column("throughput_unit", sa.String(length=20), nullable=True),
        sa.Column("training_s", sa.Float(), nullable=True),
        sa.Column("total_s", sa.Float(), nullable=True),
        sa.Column("pgid", sa.Integer(), nullable=True),
        sa.Column("log_path", sa.Text(), nullable=True),
        sa.Column("device", sa.String(length=100), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.create_index("ix_runs_sweep", ["sweep_id", "id"], unique=False)
        batch_op.create_index("ix_runs_experiment", ["experiment_id", "id"], unique=False)
        batch_op.create_index("ix_runs_status", ["status"], unique=False)
    op.execute(_BACKFILL.format(**_JSON_READS[op.get_bind().dialect.name]))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_status")
        batch_op.drop_index("ix_runs_experiment")
        batch_op.drop_index("ix_runs_sweep")
    op.drop_table("runs")
