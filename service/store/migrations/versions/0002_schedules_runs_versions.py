"""schedules, schedule runs, schedule versions

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIGPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("cron", sa.String(200), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("overlap", sa.String(16), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("output_path", sa.Text(), nullable=False, unique=True),
        sa.Column("api_key_id", sa.String(32), nullable=True),
        sa.Column("next_fire_at", TS, nullable=True),
        sa.Column("pending_fire_at", TS, nullable=True),
        sa.Column("run_seq", sa.Integer(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index("ix_schedules_name", "schedules", ["name"])
    op.create_index("ix_schedules_next_fire_at", "schedules", ["next_fire_at"])
    op.create_table(
        "schedule_runs",
        sa.Column("id", BIGPK, primary_key=True, autoincrement=True),
        sa.Column("schedule_id", sa.String(32), sa.ForeignKey("schedules.id", ondelete="CASCADE"), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("fire_at", TS, nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("ended_at", TS, nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("job_id", sa.String(32), nullable=True),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("inputs", JSON, nullable=False),
        sa.Column("fingerprints", JSON, nullable=False),
        sa.UniqueConstraint("schedule_id", "number", name="uq_schedule_runs_number"),
        sa.UniqueConstraint("schedule_id", "fire_at", name="uq_schedule_runs_slot"),
    )
    op.create_index("ix_schedule_runs_state", "schedule_runs", ["state"])
    op.create_table(
        "schedule_versions",
        sa.Column("id", BIGPK, primary_key=True, autoincrement=True),
        sa.Column("schedule_id", sa.String(32), sa.ForeignKey("schedules.id", ondelete="CASCADE"), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("run_number", sa.Integer(), nullable=False),
        sa.Column("documents", sa.BigInteger(), nullable=True),
        sa.Column("samples", sa.BigInteger(), nullable=True),
        sa.Column("tokens", sa.BigInteger(), nullable=True),
        sa.Column("shards", sa.Integer(), nullable=True),
        sa.Column("published_at", TS, nullable=False),
        sa.UniqueConstraint("schedule_id", "number", name="uq_schedule_versions_number"),
    )


def downgrade() -> None:
    op.drop_table("schedule_versions")
    op.drop_index("ix_schedule_runs_state", "schedule_runs")
    op.drop_table("schedule_runs")
    op.drop_index("ix_schedules_next_fire_at", "schedules")
    op.drop_index("ix_schedules_name", "schedules")
    op.drop_table("schedules")
