"""A background loop that acts only while it holds a lock file: the supervisor's and the scheduler's base.

Several service processes may share one state folder; exactly one of them (the holder of ``<name>.lock``,
an ``flock``) runs the jobs or fires the schedules, and another takes over as soon as that one exits.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)


class LeaderLoop:
    """Calls :meth:`tick` every ``poll_s`` seconds (sooner after :meth:`wake`) while holding ``lock_path``."""

    name = "leader"

    def __init__(self, lock_path: Path, poll_s: float):
        self.lock_path, self.poll_s = lock_path, poll_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_fd: int | None = None

    def tick(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"tokenmill-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop and give the lock up (job processes keep running: the next leader re-attaches)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def wake(self) -> None:
        self._wake.set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def leading(self) -> bool:
        """Whether this process holds the lock (and so does the work)."""
        return self._lock_fd is not None

    def _try_lead(self) -> bool:
        if self._lock_fd is not None:
            return True
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        log.info("%s: leading (%s)", self.name, self.lock_path)
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._try_lead():
                    self.tick()
            except Exception:  # noqa: BLE001 - a bad tick (the database away) must not end the loop
                log.exception("%s tick failed; retrying", self.name)
            self._wake.wait(self.poll_s)
            self._wake.clear()
