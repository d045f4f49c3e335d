"""The database: an engine, sessions, and the schema brought to the latest Alembic revision at startup.

SQLite (a file, the default) and PostgreSQL (by URL, e.g. ``postgresql+psycopg://user@/db?host=/var/run/postgresql``
for the Unix socket) behave the same to the code above:

- SQLite runs in WAL mode (readers never wait for the writer) and every :meth:`Database.session`
  transaction starts with ``BEGIN IMMEDIATE``: the write lock is taken up front, so two writers queue on the
  busy timeout instead of one failing with "database is locked" when it upgrades a read lock (the recipe in
  SQLAlchemy's SQLite dialect docs, "Enabling non-legacy SQLite transactional modes", with IMMEDIATE instead
  of BEGIN). A :meth:`Database.read` transaction starts with a plain (deferred) ``BEGIN``: it reads one
  snapshot and takes no lock, so readers neither queue behind each other nor behind a writer. It may not
  write (a flush raises), since upgrading a deferred read to a write is what fails with "database is locked".
- PostgreSQL can keep the tables in their own ``schema`` (``search_path``), which is how the tests give
  each session a fresh, private set of tables on a shared server.

:meth:`Database.migrate` runs ``alembic upgrade head`` in-process, under a lock (an advisory lock on
PostgreSQL, the write lock on SQLite), so several service processes starting at once migrate once.
A new table or column is a new revision in ``migrations/versions`` (``down_revision`` = the latest one),
written by hand or started with ``alembic.command.revision(cfg, message=...)`` on a ``Config`` whose
``script_location`` is :data:`MIGRATIONS`; the models in :mod:`service.store.models` must agree with it.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

T = TypeVar("T")

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
#: milliseconds a SQLite writer waits for the lock before failing: far above any transaction here (a few ms)
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: an arbitrary constant naming tokenmill's migration lock among PostgreSQL advisory locks
_MIGRATION_LOCK = 0x746F6B6D  # "tokm"
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: the execution option that marks a read session's connection
_READ = "tokenmill_read_only"
#: seconds a pooled PostgreSQL connection may have been idle and still be used without a ping (see
#: _pg_checkout_ping)
PING_IDLE_S = 2.0
_RETURNED = "tokenmill_returned_at"


class ReadOnlyError(RuntimeError):
    """A :meth:`Database.read` session was asked to write."""


class ReadSession(Session):
    """A session that refuses to flush changes (see :meth:`Database.read`)."""

    def flush(self, objects: Any = None) -> None:
        if self.new or self.dirty or self.deleted:
            raise ReadOnlyError("a read-only session (Database.read) was asked to write; use Database.session")


class Database:
    """One engine and its sessions. ``with db.session() as s:`` is one transaction, committed on exit;
    ``with db.read() as s:`` one that only reads (cheaper on SQLite; see the module's docstring)."""

    def __init__(self, url: str | URL, schema: str | None = None, echo: bool = False):
        self.url = make_url(url)
        self.schema = schema
        if schema is not None and not _SCHEMA_NAME.match(schema):
            raise ValueError(f"database schema {schema!r}: lower-case letters, digits and _ only")
        self.engine = _make_engine(self.url, schema, echo)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        # the same pool. SQLite: the option tells _sqlite_begin to emit a deferred BEGIN. PostgreSQL: autocommit,
        # so a read is one round trip instead of BEGIN, query, ROLLBACK (each statement sees the data committed
        # before it began, as under READ COMMITTED, the default, where two statements never shared a snapshot)
        read_options: dict[str, Any] = {_READ: True}
        if not self.is_sqlite:
            read_options["isolation_level"] = "AUTOCOMMIT"
        self.read_engine = self.engine.execution_options(**read_options)
        self.read_sessions = sessionmaker(self.read_engine, class_=ReadSession, expire_on_commit=False)

    @property
    def is_sqlite(self) -> bool:
        return self.url.get_backend_name() == "sqlite"

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions.begin() as session:
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only transaction: one snapshot on SQLite, no write lock; ended (rolled back) on exit."""
        with self.read_sessions() as session:
            yield session
            session.flush()  # raises if anything was changed: it would be dropped silently otherwise

    @contextmanager
    def read_connection(self) -> Iterator[Connection]:
        """As :meth:`read`, a Core connection instead of an ORM session (no identity map: for hot reads of
        columns, such as a job's status)."""
        with self.read_engine.connect() as conn:
            yield conn

    async def run_read(self, fn: Callable[[Connection], T]) -> T:
        """``fn(conn)`` on a :meth:`read_connection`, from an event loop: for the API's hot reads (a status poll).

        - SQLite: in the event loop itself. A read of a few rows takes a fraction of a millisecond, all of it
          holding the GIL (the loop could not run meanwhile anyway), and in WAL mode it never waits: readers
          take no lock, and the cases where a reader gets SQLITE_BUSY (recovery after a crash, the last
          connection closing the WAL) do not arise while this process keeps its pool of connections open.
          A worker thread would only add two handoffs (0.3 to 1 ms of CPU per read, measured), and under load
          worse: a thread that releases the GIL around each driver call waits up to the switch interval (5 ms)
          to get it back from a busy event loop.
        - PostgreSQL: in the thread pool, since the read waits on the network and the server. (The async
          driver on the loop, through SQLAlchemy's asyncio extension, was tried: a little less CPU per read, but
          with 200 reads at once its connection pool queued unfairly, some reads waiting over 5 s, and even
          behind a fair queue it read less than half as many rows a second as the 15 pooled threads did.)
        """
        if self.is_sqlite:
            with self.read_connection() as conn:
                return fn(conn)

        def read() -> T:
            with self.read_connection() as conn:
                return fn(conn)

        return await anyio.to_thread.run_sync(read)

    def ping(self) -> None:
        """Raises when the database cannot answer ``SELECT 1``."""
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def migrate(self, revision: str = "head") -> None:
        """Create or upgrade the schema to ``revision``, the latest by default (idempotent; the tests of a
        revision's upgrade start from the one before)."""
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
            command.upgrade(cfg, revision)

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
    engine = create_engine(url, **kwargs)
    event.listen(engine, "checkin", _pg_checkin)
    event.listen(engine, "checkout", _pg_checkout_ping(engine))
    return engine


def _pg_checkin(dbapi_conn: Any, record: Any) -> None:
    record.info[_RETURNED] = time.monotonic()


def _pg_checkout_ping(engine: Engine) -> Callable[[Any, Any, Any], None]:
    """SQLAlchemy's ``pool_pre_ping``, except for a connection back in the pool for under :data:`PING_IDLE_S`.

    A ping is a round trip before every transaction, which for a status poll (one statement) doubles the
    round trips, each a wake-up of the server's backend and of a worker thread. A connection used a moment ago
    is almost surely still open; if the server went away in that moment, the statement fails instead
    (a 503, the pool is invalidated and the next checkout reconnects)."""

    def checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        if time.monotonic() - record.info.get(_RETURNED, float("-inf")) < PING_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as exc:
            raise DisconnectionError(f"pre-ping: {exc}") from exc  # the pool retries on a new connection

    return checkout


def _sqlite_connect(dbapi_conn: Any, record: Any) -> None:
    dbapi_conn.isolation_level = None  # the driver emits no BEGIN of its own: _sqlite_begin does
    cur = dbapi_conn.cursor()
    _private_files(cur)
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.close()


def _private_files(cur: Any) -> None:
    """Make the SQLite file readable by the service's user only (0600): it holds the specs' secrets
    (:mod:`pipeline.secret_fields`) and the keys' hashes. Done as each connection opens, before WAL mode: SQLite
    has just made a new file (empty, with the umask's mode) and gives the ``-wal`` and ``-shm`` files it makes
    the database file's mode; an older, readable database is tightened the same way."""
    for _, name, path in cur.execute("PRAGMA database_list").fetchall():
        if name != "main" or not path:
            continue
        for file in (path, f"{path}-wal", f"{path}-shm"):
            with contextlib.suppress(FileNotFoundError):
                if os.stat(file).st_mode & 0o077:
                    os.chmod(file, 0o600)


def _sqlite_begin(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(_READ) else "BEGIN IMMEDIATE")
