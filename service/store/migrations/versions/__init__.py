"""Alembic revisions, one file each; ``down_revision`` chains them."""
