"""jobs, job attempts, job events, API keys

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIGPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    _create_jobs()
    _create_job_attempts()
    _create_job_events()
    _create_api_keys()


def _create_jobs() -> None:
    op.create_table(
        "jobs",
        sa.Column("seq", BIGPK, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(32), nullable=False, unique=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("spec_hash", sa.String(64), nullable=False),
        sa.Column("output_path", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.String(320), nullable=True, unique=True),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("api_key_id", sa.String(32), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("failure_category", sa.String(16), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("summary", JSON, nullable=False),
        sa.Column("event_seq", sa.Integer(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("queued_at", TS, nullable=False),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
    )
    op.create_index("ix_jobs_name", "jobs", ["name"])
    op.create_index("ix_jobs_state_queued_at", "jobs", ["state", "queued_at"])
    op.create_index("ix_jobs_created_at", "jobs", ["created_at"])


def _create_job_attempts() -> None:
    op.create_table(
        "job_attempts",
        sa.Column("id", BIGPK, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("run_dir", sa.Text(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("proc_started", sa.Float(), nullable=True),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("ended_at", TS, nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("events_offset", sa.BigInteger(), nullable=False),
        sa.Column("cancel_sent_at", TS, nullable=True),
        sa.UniqueConstraint("job_id", "number", name="uq_job_attempts_job_number"),
    )


def _create_job_events() -> None:
    op.create_table(
        "job_events",
        sa.Column("id", BIGPK, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("data", JSON, nullable=False),
        sa.UniqueConstraint("job_id", "seq", name="uq_job_events_job_seq"),
    )


def _create_api_keys() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("revoked_at", TS, nullable=True),
        sa.Column("last_used_at", TS, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("api_keys")
    op.drop_table("job_events")
    op.drop_table("job_attempts")
    op.drop_index("ix_jobs_created_at", "jobs")
    op.drop_index("ix_jobs_state_queued_at", "jobs")
    op.drop_index("ix_jobs_name", "jobs")
    op.drop_table("jobs")
