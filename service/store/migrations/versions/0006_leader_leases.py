"""leader leases: which replica leads the supervisor and the scheduler on PostgreSQL

A row per loop with its holder, a fencing token raised at each acquisition and an expiry by the database's
clock (:mod:`service.runner.lease`). SQLite keeps its file lock; the table is there, empty.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "leader_leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leader_leases")
