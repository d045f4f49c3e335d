"""Alembic migrations of the control plane's database (run by ``service.store.db.Database.migrate``)."""
