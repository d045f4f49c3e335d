"""job kinds: a job runs the pipeline engine (``pipeline``) or an ablation (``ablation``, ``POST /v1/ablations``)

An ablation is a set of jobs and proxy trainings that one job process runs through ``tokenmill ablate``'s
runner, so it gets a job's queue, launch, cancel, logs and lost-process resume. Existing jobs are pipelines.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("kind", sa.String(16), nullable=False, server_default="pipeline"))
    op.create_index("ix_jobs_kind_seq", "jobs", ["kind", "seq"])


def downgrade() -> None:
    op.drop_index("ix_jobs_kind_seq", "jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("kind")
