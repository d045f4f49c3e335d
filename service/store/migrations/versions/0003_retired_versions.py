"""retired versions: a deleted schedule's published versions, still served under its id

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

BIGPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "retired_versions",
        sa.Column("id", BIGPK, primary_key=True, autoincrement=True),
        sa.Column("schedule_id", sa.String(32), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("run_number", sa.Integer(), nullable=False),
        sa.Column("documents", sa.BigInteger(), nullable=True),
        sa.Column("samples", sa.BigInteger(), nullable=True),
        sa.Column("tokens", sa.BigInteger(), nullable=True),
        sa.Column("shards", sa.Integer(), nullable=True),
        sa.Column("published_at", TS, nullable=False),
        sa.Column("retired_at", TS, nullable=False),
        sa.UniqueConstraint("schedule_id", "number", name="uq_retired_versions_number"),
    )


def downgrade() -> None:
    op.drop_table("retired_versions")
