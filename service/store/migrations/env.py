"""Alembic environment: migrations run in-process on the connection :meth:`service.store.db.Database.migrate`
passes in ``config.attributes["connection"]`` (no ``alembic.ini``, no URL here)."""

from __future__ import annotations

from alembic import context

from service.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through service.store.db.Database.migrate(), which passes a connection")
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True,
                  compare_type=True)
with context.begin_transaction():
    context.run_migrations()
