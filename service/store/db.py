"""The database: an engine, sessions, and the schema brought to the latest Alembic revision at startup.

SQLite (a file, the default) and PostgreSQL (by URL, e.g. ``postgresql+psycopg://user@/db?host=/var/run/postgresql``
for the Unix socket) behave the same to the code above:

- SQLite runs in WAL mode (readers never wait for the writer) and every transaction starts with
  ``BEGIN IMMEDIATE``: the write lock is taken up front, so two writers queue on the busy timeout instead
  of one failing with "database is locked" when it upgrades a read lock (the recipe in SQLAlchemy's
  SQLite dialect docs, "Enabling non-legacy SQLite transactional modes", with IMMEDIATE instead of BEGIN).
- PostgreSQL can keep the tables in their own ``schema`` (``search_path``), which is how the tests give
  each session a fresh, private set of tables on a shared server.

:meth:`Database.migrate` runs ``alembic upgrade head`` in-process, under a lock (an advisory lock on
PostgreSQL, the write lock on SQLite), so several service processes starting at once migrate once.
A new table or column is a new revision in ``migrations/versions`` (``down_revision`` = the latest one),
written by hand or started with ``alembic.command.revision(cfg, message=...)`` on a ``Config`` whose
``script_location`` is :data:`MIGRATIONS`; the models in :mod:`service.store.models` must agree with it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
#: milliseconds a SQLite writer waits for the lock before failing: far above any transaction here (a few ms)
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: an arbitrary constant naming tokenmill's migration lock among PostgreSQL advisory locks
_MIGRATION_LOCK = 0x746F6B6D  # "tokm"
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class Database:
    """One engine and its sessions. ``with db.session() as s:`` is one transaction, committed on exit."""

    def __init__(self, url: str | URL, schema: str | None = None, echo: bool = False):
        self.url = make_url(url)
        self.schema = schema
        if schema is not None and not _SCHEMA_NAME.match(schema):
            raise ValueError(f"database schema {schema!r}: lower-case letters, digits and _ only")
        self.engine = _make_engine(self.url, schema, echo)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def is_sqlite(self) -> bool:
        return self.url.get_backend_name() == "sqlite"

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions.begin() as session:
            yield session

    def ping(self) -> None:
        """Raises when the database cannot answer ``SELECT 1``."""
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def migrate(self) -> None:
        """Create or upgrade the schema to the latest revision (idempotent)."""
        from alembic import command
        from alembic.config import Config

        if self.is_sqlite and self.url.database:
            Path(self.url.database).parent.mkdir(parents=True, exist_ok=True)
        with self.engine.begin() as conn:
            if not self.is_sqlite:
                if self.schema:
                    conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS))
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    def drop_schema(self) -> None:
        """Drop a PostgreSQL schema and everything in it (the tests' cleanup)."""
        if self.schema and not self.is_sqlite:
            with self.engine.begin() as conn:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    def dispose(self) -> None:
        self.engine.dispose()


def _make_engine(url: URL, schema: str | None, echo: bool) -> Engine:
    kwargs: dict[str, Any] = {"echo": echo}
    if url.get_backend_name() == "sqlite":
        if url.database in (None, "", ":memory:"):
            raise ValueError("database URL: use a SQLite file (several threads and processes share it)")
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
        engine = create_engine(url, **kwargs)
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    if schema:
        kwargs["connect_args"] = {"options": f"-csearch_path={schema}"}
    return create_engine(url, pool_pre_ping=True, **kwargs)


def _sqlite_connect(dbapi_conn: Any, record: Any) -> None:
    dbapi_conn.isolation_level = None  # the driver emits no BEGIN of its own: _sqlite_begin does
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.close()


def _sqlite_begin(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")
