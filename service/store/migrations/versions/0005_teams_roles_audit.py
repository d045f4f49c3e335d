"""teams and roles: every key an admin, member or reader of a team; jobs, schedules and mixtures a team's;
the audit table

Keys made before this revision become ``admin`` of the ``default`` team (they could do everything before, and
still can); every existing job, schedule, retired version and mixture becomes the ``default`` team's.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

DEFAULT_TEAM = "default"
#: tables whose rows belong to a team (existing rows: the default team's)
OWNED = ("jobs", "schedules", "retired_versions", "mixtures")
BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # existing keys: admins of the default team; the server default is dropped afterwards, so a key is never
    # made an admin by omission (the service always names the role)
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("role", sa.String(16), nullable=False, server_default="admin"))
        batch.add_column(sa.Column("team", sa.String(64), nullable=False, server_default=DEFAULT_TEAM))
    with op.batch_alter_table("api_keys") as batch:
        batch.alter_column("role", server_default=None)
        batch.alter_column("team", server_default=None)
    for table in OWNED:
        op.add_column(table, sa.Column("team", sa.String(64), nullable=False, server_default=DEFAULT_TEAM))
    op.create_index("ix_jobs_team_seq", "jobs", ["team", "seq"])
    op.create_table(
        "audit",
        sa.Column("id", BigIntPK, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("key_name", sa.String(200), nullable=True),
        sa.Column("team", sa.String(64), nullable=True),
        sa.Column("role", sa.String(16), nullable=True),
        sa.Column("action", sa.String(200), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
    )
    op.create_index("ix_audit_team_id", "audit", ["team", "id"])


def downgrade() -> None:
    op.drop_index("ix_audit_team_id", "audit")
    op.drop_table("audit")
    op.drop_index("ix_jobs_team_seq", "jobs")
    for table in OWNED:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("team")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("team")
        batch.drop_column("role")
