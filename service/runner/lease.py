"""Who leads a loop (the supervisor, the scheduler): a file lock on SQLite, a lease row on PostgreSQL.

SQLite is one machine's file, so an ``flock`` beside it (``STATE/<name>.lock``) is enough: the holder leads
until its process exits. Replicas on PostgreSQL need not share a filesystem, so there leadership is a row of
``leader_leases`` per loop: its ``holder`` (``host:pid:random``), a fencing ``token`` raised at each
acquisition and an ``expires_at`` that the holder pushes ``lease_s`` ahead at every poll, every fenced write and
every ``lease_s / 3`` from a heartbeat thread while the loop's thread lives (so a long tick keeps the lease).
The database's clock (``clock_timestamp()``) decides expiry, never a replica's. Another replica may take the
row only once it has expired, and every write that acts on a job or fires a schedule runs :meth:`fence` in its
own transaction: a conditional UPDATE of the holder's unexpired row with its token, which also holds the row
lock until the write commits. So a replica that lost its lease has its writes refused
(:class:`LostLease`) before the next holder can acquire, and a takeover waits for any fenced write in flight.
A clean stop releases the row (expiry = now), so a rolling update hands over at once.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Protocol

from sqlalchemy import text
from sqlalchemy.orm import Session

from service.settings import LEASE_S
from service.store.db import Database

log = logging.getLogger("tokenmill.lease")

#: this process among replicas: the random part tells a restarted container (same host name, pid 1) apart
PROCESS_HOLDER = f"{socket.gethostname()[:160]}:{os.getpid()}:{secrets.token_hex(4)}"

_ACQUIRE = text("""
INSERT INTO leader_leases (name, holder, token, acquired_at, expires_at)
VALUES (:name, :holder, 1, clock_timestamp(), clock_timestamp() + make_interval(secs => :lease_s))
ON CONFLICT (name) DO UPDATE SET
    token = CASE WHEN leader_leases.holder = :holder AND leader_leases.expires_at > clock_timestamp()
                 THEN leader_leases.token ELSE leader_leases.token + 1 END,
    acquired_at = CASE WHEN leader_leases.holder = :holder AND leader_leases.expires_at > clock_timestamp()
                       THEN leader_leases.acquired_at ELSE clock_timestamp() END,
    holder = :holder,
    expires_at = clock_timestamp() + make_interval(secs => :lease_s)
WHERE leader_leases.holder = :holder OR leader_leases.expires_at <= clock_timestamp()
RETURNING token
""")
_FENCE = text("""
UPDATE leader_leases SET expires_at = clock_timestamp() + make_interval(secs => :lease_s)
WHERE name = :name AND holder = :holder AND token = :token AND expires_at > clock_timestamp()
RETURNING token
""")
_RELEASE = text("UPDATE leader_leases SET expires_at = clock_timestamp() WHERE name = :name AND holder = :holder "
                "AND token = :token")


class LostLease(RuntimeError):
    """Another replica leads this loop now (or this one's lease expired): the write was refused."""


class Leadership(Protocol):
    """What :class:`service.runner.leader.LeaderLoop` asks of a way to lead."""

    #: seconds between renewals while the loop runs (:meth:`renew`); None: nothing to renew
    renew_every_s: float | None

    def acquire(self) -> bool:
        """Lead or keep leading; whether this process leads now."""

    @property
    def leading(self) -> bool:
        """Whether this process leads, as far as it knows without asking."""

    def fence(self, s: Session) -> None:
        """Raise :class:`LostLease` unless this process still leads, within ``s``'s transaction."""

    def check(self) -> None:
        """Raise :class:`LostLease` unless this process still leads by its own clock (before an act outside the
        database: starting a process)."""

    def renew(self) -> None:
        """Push the lease's expiry on while leading (a long tick keeps it); never acquires."""

    def release(self) -> None:
        """Stop leading and let another process lead at once."""


class FileLock:
    """An ``flock`` on ``path``: held until released or the process exits (the single-machine, SQLite mode)."""

    renew_every_s: float | None = None

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        log.info("leading (%s)", self.path)
        return True

    @property
    def leading(self) -> bool:
        return self._fd is not None

    def fence(self, s: Session) -> None:
        """Nothing to check: the lock cannot pass to another process while this one lives."""

    def check(self) -> None:
        """Nothing to check, as :meth:`fence`."""

    def renew(self) -> None:
        """Nothing to renew: the lock lasts as long as the process."""

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class DbLease:
    """The ``leader_leases`` row ``name`` on PostgreSQL (see the module's docstring)."""

    def __init__(self, db: Database, name: str, *, lease_s: float = LEASE_S, holder: str = PROCESS_HOLDER):
        self.db, self.name, self.lease_s, self.holder = db, name, lease_s, holder
        self.renew_every_s: float | None = lease_s / 3
        self.token: int | None = None
        self._valid_until = 0.0  # monotonic: a lower bound of the row's expiry, from before the renewal was sent
        self._mutex = threading.Lock()

    def _params(self) -> dict[str, object]:
        return {"name": self.name, "holder": self.holder, "lease_s": self.lease_s, "token": self.token}

    def acquire(self) -> bool:
        with self._mutex:
            sent = time.monotonic()
            with self.db.session() as s:
                token = s.execute(_ACQUIRE, self._params()).scalar_one_or_none()
            if token is None:
                if self.token is not None:
                    log.warning("%s: lease lost to another replica", self.name)
                self.token, self._valid_until = None, 0.0
                return False
            if token != self.token:
                log.info("%s: leading (lease token %d, %s)", self.name, token, self.holder)
            self.token, self._valid_until = token, sent + self.lease_s
            return True

    @property
    def leading(self) -> bool:
        return self.token is not None and time.monotonic() < self._valid_until

    def fence(self, s: Session) -> None:
        if self.token is None and not self.acquire():  # a loop driven by hand (tick() without start())
            raise LostLease(f"{self.name}: another replica leads")
        sent = time.monotonic()
        if s.execute(_FENCE, self._params()).scalar_one_or_none() is None:
            self.token, self._valid_until = None, 0.0
            raise LostLease(f"{self.name}: the lease expired or another replica took it over")
        self._valid_until = max(self._valid_until, sent + self.lease_s)

    def check(self) -> None:
        if not self.leading:
            raise LostLease(f"{self.name}: the lease expired")

    def renew(self) -> None:
        if self.token is None:
            return
        try:
            with self.db.session() as s:
                self.fence(s)
        except LostLease as exc:
            log.warning("%s", exc)

    def release(self) -> None:
        with self._mutex:
            if self.token is None:
                return
            try:
                with self.db.session() as s:
                    s.execute(_RELEASE, self._params())
            except Exception:  # noqa: BLE001 - the database away: the lease simply expires
                log.warning("%s: cannot release the lease; it expires in %.0f s", self.name, self.lease_s)
            self.token, self._valid_until = None, 0.0


def leadership_for(db: Database, name: str, lock_path: Path, lease_s: float = LEASE_S) -> Leadership:
    """The file lock beside a SQLite database, the lease row on PostgreSQL."""
    return FileLock(lock_path) if db.is_sqlite else DbLease(db, name, lease_s=lease_s)
