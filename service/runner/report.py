"""How a job process reports to the control plane: through the database, never through files the service reads.

The supervisor writes what an attempt is to run (its spec with the service's settings) in the attempt's row and
starts the job process with the attempt's job id and number and the database (``TOKENMILL_DATABASE_URL``,
``TOKENMILL_DATABASE_SCHEMA``: :func:`database_env`). The job process (:class:`Reporter`):

- reads its run from the row (:meth:`Reporter.run`);
- reports each engine event (:class:`EventOutbox`): kept in order in memory and written by a thread in batches,
  so a slow or briefly unreachable database never holds the engine; the terminal event is written before the
  process exits (retried for :data:`TERMINAL_WAIT_S`: past that the outcome is lost, and the supervisor resumes
  the job as after a crash);
- ships the logs it writes in its own folder (``job.log``, ``ray.log``) to ``attempt_logs`` in pieces
  (:class:`LogShipper`), the rest when it exits; what a crash leaves unshipped, the supervisor ships when the
  process ran on its host (:func:`ship_rest`);
- asks whether it may publish through two columns of its row (:mod:`service.runner.publish`).

So every replica serves a job's events and logs, a new leader goes on from the database alone, and a Ray Jobs
driver needs the database and nothing the service's disk holds. Every write is idempotent (an event's
``seq``, a log piece's ``offset``), so a write retried after a lost answer stores nothing twice.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from pipeline.job import events as ev
from service.store.db import Database
from service.store.models import Attempt, AttemptEvent, AttemptLog, utcnow

log = logging.getLogger("tokenmill.report")

DATABASE_URL_ENV, DATABASE_SCHEMA_ENV = "TOKENMILL_DATABASE_URL", "TOKENMILL_DATABASE_SCHEMA"
LOG_FILE = "job.log"
#: Ray's own output (its core's lines, its loggers, Ray Data's): beside LOG_FILE, never in it
RAY_LOG_FILE = "ray.log"  # pipeline.job.tasks.RAY_LOG (not imported: it imports Ray, and the API imports this)
#: ``attempt_logs.source`` -> the file of the job process's folder it copies
LOG_SOURCES = {"job": LOG_FILE, "ray": RAY_LOG_FILE}
TERMINAL_EVENTS = frozenset({ev.JobFinished.type, ev.JobFailed.type})
#: seconds between two batches of events, and between two looks at the log files
FLUSH_S = 0.25
LOG_FLUSH_S = 1.0
#: events per write, and bytes per log piece
BATCH = 500
LOG_PIECE = 256 * 1024
#: seconds the terminal event (and the last log pieces) may take to reach the database at exit
TERMINAL_WAIT_S = 60.0


def database_env(url: str, schema: str | None, *, keep_password: bool) -> dict[str, str]:
    """The environment that names the database to a job process. Without ``keep_password`` (a Ray Jobs
    submission, whose environment the cluster's dashboard shows) the URL goes without its password: the
    cluster supplies it (``PGPASSWORD``, a ``.pgpass`` file, a client certificate)."""
    parsed = make_url(url)
    if not keep_password:
        parsed = parsed._replace(password=None)  # URL.set ignores None
    env = {DATABASE_URL_ENV: parsed.render_as_string(hide_password=False)}
    if schema:
        env[DATABASE_SCHEMA_ENV] = schema
    return env


def database_from_env(environ: Mapping[str, str] | None = None) -> Database:
    env = os.environ if environ is None else environ
    url = env.get(DATABASE_URL_ENV)
    if not url:
        raise RuntimeError(f"{DATABASE_URL_ENV} is not set: a job process is started by tokenmill serve")
    return Database(url, schema=env.get(DATABASE_SCHEMA_ENV) or None)


def _insert(s: Session, model: type[Any]) -> Any:
    """An INSERT that skips rows already there (a retried write): the dialect's ON CONFLICT DO NOTHING."""
    insert = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
    return insert(model).on_conflict_do_nothing()


def _without_nul(value: Any) -> Any:
    """``value`` with U+0000 replaced (PostgreSQL's JSON cannot hold it; an input's text may carry it)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(v) for v in value]
    return value


class EventOutbox:
    """The engine's event sink: events keep their order and reach ``attempt_events`` from a thread, in batches."""

    def __init__(self, db: Database, job_id: str, attempt: int, flush_s: float = FLUSH_S):
        self.db, self.job_id, self.attempt, self.flush_s = db, job_id, attempt, flush_s
        self.terminal: str | None = None
        self._pending: list[dict[str, Any]] = []
        self._seq = 0
        self._cond = threading.Condition()
        self._writing = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="tokenmill-events", daemon=True)
        self._thread.start()

    def __call__(self, event: ev.Event) -> None:
        self.report(ev.to_dict(event))

    def report(self, record: dict[str, Any]) -> None:
        """Queue one event (``{"type": ..., ...}``); a terminal one is written before this returns."""
        final = record.get("type") in TERMINAL_EVENTS
        with self._cond:
            self._seq += 1
            self._pending.append({"job_id": self.job_id, "attempt": self.attempt, "seq": self._seq,
                                  "data": _without_nul(record)})
            if final:
                self.terminal = str(record["type"])
        if final:
            self.flush(TERMINAL_WAIT_S)

    def _write(self) -> int:
        """One batch written (and dropped from the queue); the number of events it held."""
        with self._writing:
            with self._cond:
                batch = self._pending[:BATCH]
            if not batch:
                return 0
            with self.db.session() as s:
                s.execute(_insert(s, AttemptEvent), batch)
            with self._cond:
                del self._pending[:len(batch)]
            return len(batch)

    def _loop(self) -> None:
        backoff = self.flush_s
        while True:
            with self._cond:
                if self._closed:
                    return
                self._cond.wait(backoff)
            try:
                while self._write():
                    pass
                backoff = self.flush_s
            except Exception as exc:  # noqa: BLE001 - the database is away: keep the events, try again
                log.warning("events not yet reported (%s); retrying", exc)
                backoff = min(5.0, backoff * 2)

    def flush(self, timeout: float) -> bool:
        """Write every queued event; False if the database did not take them within ``timeout`` seconds."""
        def write_all() -> None:
            while self._write():
                pass

        return _retry(write_all, timeout, "report the events")

    def close(self) -> None:
        self.flush(TERMINAL_WAIT_S)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)


class LogShipper:
    """Copies what the job process's log files gain into ``attempt_logs``, from a thread, piece by piece."""

    def __init__(self, db: Database, job_id: str, attempt: int, folder: Path, interval_s: float = LOG_FLUSH_S):
        self.db, self.job_id, self.attempt, self.folder = db, job_id, attempt, folder
        self.interval_s = interval_s
        self.offsets: dict[str, int] = {}  # a job process ships its own attempt's logs from their start
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> LogShipper:
        self._thread = threading.Thread(target=self._loop, name="tokenmill-logs", daemon=True)
        self._thread.start()
        return self

    def ship(self) -> None:
        """Store what the files hold past what was shipped (a file that shrank was replaced: shipped again)."""
        with self._lock:
            for source in LOG_SOURCES:
                with self.db.session() as s:
                    self.offsets[source] = _ship_file(s, self.job_id, self.attempt, source, self.folder,
                                                      self.offsets.get(source, 0))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.ship()
            except Exception as exc:  # noqa: BLE001 - shipped on a later round
                log.warning("log not yet shipped (%s)", exc)

    def close(self, timeout: float = TERMINAL_WAIT_S) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        _retry(self.ship, timeout, "ship the log's end")


def _retry(action: Callable[[], None], timeout: float, what: str) -> bool:
    """``action`` until it succeeds (True) or ``timeout`` seconds have passed (False, logged): a database that is
    away for a moment loses nothing of what a job process reports at its end."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            action()
            return True
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            if time.monotonic() >= deadline:
                log.error("could not %s: %s", what, exc)
                return False
            time.sleep(0.5)


def _ship_file(s: Session, job_id: str, attempt: int, source: str, folder: Path, start: int) -> int:
    """Store the log ``source``'s bytes past ``start`` (from 0 if the file shrank: it was replaced); where it ends."""
    for offset, piece in _pieces(folder / LOG_SOURCES[source], start):
        s.execute(_insert(s, AttemptLog), [{"job_id": job_id, "attempt": attempt, "source": source,
                                            "offset": offset, "data": piece}])
        start = offset + len(piece)
    return start


def _pieces(path: Path, start: int) -> Iterable[tuple[int, bytes]]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() < start:
                start = 0
            f.seek(start)
            while piece := f.read(LOG_PIECE):
                yield start, piece
                start += len(piece)
    except FileNotFoundError:
        return


def shipped(s: Session, job_id: str, attempt: int) -> dict[str, int]:
    """Bytes of each log source already stored for the attempt."""
    rows = s.execute(select(AttemptLog.source, AttemptLog.offset, AttemptLog.data)
                     .where(AttemptLog.job_id == job_id, AttemptLog.attempt == attempt)).all()
    ends: dict[str, int] = {}
    for source, offset, data in rows:
        ends[source] = max(ends.get(source, 0), offset + len(data))
    return ends


def ship_rest(s: Session, job_id: str, attempt: int, folder: str) -> None:
    """From the supervisor, in its transaction, once the attempt's process is gone: store what the process left
    unshipped in its folder on this machine."""
    if not os.path.isdir(folder):
        return
    ends = shipped(s, job_id, attempt)
    for source in LOG_SOURCES:
        _ship_file(s, job_id, attempt, source, Path(folder), ends.get(source, 0))


def log_tail(s: Session, job_id: str, attempt: int, source: str, n: int) -> bytes:
    """The last ``n`` bytes of the attempt's log ``source`` as stored."""
    stmt = (select(AttemptLog.data).where(AttemptLog.job_id == job_id, AttemptLog.attempt == attempt,
                                          AttemptLog.source == source).order_by(AttemptLog.offset.desc()))
    pieces: list[bytes] = []
    size = 0
    for (data,) in s.execute(stmt):
        if size >= n:
            break
        pieces.append(data)
        size += len(data)
    whole = b"".join(reversed(pieces))
    return whole[-n:] if n else b""


class Reporter:
    """One job process's side of the database: its run, its event sink, its log shipper, its publish request."""

    def __init__(self, db: Database, job_id: str, attempt: int, folder: Path):
        self.db, self.job_id, self.attempt, self.folder = db, job_id, attempt, folder
        self.events = EventOutbox(db, job_id, attempt)
        self.logs = LogShipper(db, job_id, attempt, folder).start()

    def run(self) -> dict[str, Any]:
        with self.db.read() as s:
            run = s.scalars(select(Attempt.run).where(Attempt.job_id == self.job_id,
                                                     Attempt.number == self.attempt)).one_or_none()
        if not isinstance(run, dict):
            raise RuntimeError(f"the database holds no run for attempt {self.attempt} of job {self.job_id}")
        return run

    def close(self) -> None:
        self.events.close()
        self.logs.close()


def request_publish(db: Database, job_id: str, attempt: int) -> None:
    with db.session() as s:
        s.execute(update(Attempt).where(Attempt.job_id == job_id, Attempt.number == attempt,
                                        Attempt.publish_requested_at.is_(None))
                  .values(publish_requested_at=utcnow()))


def publish_answer(db: Database, job_id: str, attempt: int) -> str | None:
    with db.read() as s:
        return s.scalars(select(Attempt.publish_answer).where(Attempt.job_id == job_id,
                                                              Attempt.number == attempt)).one_or_none()

