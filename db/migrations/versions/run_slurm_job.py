"""runs.slurm_job_id: the Slurm job that ran a run (executor 'slurm')

Recorded when the job is submitted, and again on the run that adopts a job after a restart (the
same id on the interrupted run and on its retry's run). A plain nullable ADD COLUMN: no table
copy; runs already there keep NULL. Dialect-neutral: Alembic ops only.

Revision ID: run_slurm_job
Revises: track_marks
"""

import sqlalchemy as sa
from alembic import op

revision = "run_slurm_job"
down_revision = "track_marks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("slurm_job_id", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("slurm_job_id")
