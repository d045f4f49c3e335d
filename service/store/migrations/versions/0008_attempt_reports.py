"""attempt reports: a job process reports to the database, not to files in a shared state folder

The run an attempt is to do (``job_attempts.run``), the events it reports (``attempt_events``, which the leading
supervisor moves into ``job_events`` in order), its logs (``attempt_logs``, what ``GET /v1/jobs/{id}/logs``
reads) and the cancel-or-publish handshake (``job_attempts.publish_requested_at`` / ``publish_answer``) live in
the database, so any replica serves a job and a Ray cluster needs no volume shared with the service
(:mod:`service.runner.report`). ``job_attempts.events_offset`` now counts reported events, not bytes of a file.

An attempt started by an older release still writes files: the new supervisor sees no report from it and, when
its process ends, resumes the job as a new attempt (its finished phases and shards kept).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIGPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("job_attempts") as batch:
        batch.add_column(sa.Column("run", JSON, nullable=True))
        batch.add_column(sa.Column("publish_requested_at", TS, nullable=True))
        batch.add_column(sa.Column("publish_answer", sa.String(8), nullable=True))
    op.create_table(
        "attempt_events",
        sa.Column("id", BIGPK, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", JSON, nullable=False),
        sa.UniqueConstraint("job_id", "attempt", "seq", name="uq_attempt_events_job_attempt_seq"),
    )
    op.create_table(
        "attempt_logs",
        sa.Column("id", BIGPK, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(8), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.UniqueConstraint("job_id", "attempt", "source", "offset", name="uq_attempt_logs_job_attempt_source_offset"),
    )


def downgrade() -> None:
    op.drop_table("attempt_logs")
    op.drop_table("attempt_events")
    with op.batch_alter_table("job_attempts") as batch:
        batch.drop_column("publish_answer")
        batch.drop_column("publish_requested_at")
        batch.drop_column("run")
