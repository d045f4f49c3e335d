"""A background loop that acts only while it leads: the supervisor's and the scheduler's base.

Several service processes may run the loop; exactly one of them leads it (:mod:`service.runner.lease`: the
holder of ``STATE/<name>.lock`` beside a SQLite database, the holder of the loop's lease row on PostgreSQL) and
does the work; another takes over once that one stops (at once) or dies (the lock: at once; the lease: once it
expired). The subclass's writes that act call :meth:`LeaderLoop.fence` in their transaction.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.orm import Session

from service.runner.lease import Leadership, LostLease

log = logging.getLogger(__name__)


class LeaderLoop:
    """Calls :meth:`tick` every ``poll_s`` seconds (sooner after :meth:`wake`) while ``leadership`` is held."""

    name = "leader"

    def __init__(self, leadership: Leadership, poll_s: float):
        self.leadership, self.poll_s = leadership, poll_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beat: threading.Thread | None = None

    def tick(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"tokenmill-{self.name}", daemon=True)
        self._thread.start()
        if self.leadership.renew_every_s is not None:
            self._beat = threading.Thread(target=self._heartbeat, name=f"tokenmill-{self.name}-lease", daemon=True)
            self._beat.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop and give leadership up (job processes keep running: the next leader re-attaches)."""
        self._stop.set()
        self._wake.set()
        for thread in (self._thread, self._beat):
            if thread is not None:
                thread.join(timeout)
        self._thread = self._beat = None
        self.leadership.release()

    def wake(self) -> None:
        self._wake.set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def leading(self) -> bool:
        """Whether this process leads (and so does the work)."""
        return self.leadership.leading

    def fence(self, s: Session) -> None:
        """Refuse (:class:`LostLease`) a write that acts unless this process still leads, in ``s``'s transaction."""
        self.leadership.fence(s)

    def check_leading(self) -> None:
        """Refuse (:class:`LostLease`) an act outside the database unless this process still leads."""
        self.leadership.check()

    def step(self) -> None:
        """One round of the loop: lead (or keep leading), then act; a lost lease ends the round."""
        try:
            if self.leadership.acquire():
                self.tick()
        except LostLease as exc:
            log.warning("%s: stopped acting: %s", self.name, exc)

    def _heartbeat(self) -> None:
        """Renew the lease between polls too, so a long tick (a scan hashing large new files) keeps it while the
        loop's thread lives; a process that dies stops renewing, and its lease expires."""
        every = self.leadership.renew_every_s
        assert every is not None
        while not self._stop.wait(every):
            try:
                self.leadership.renew()
            except Exception:  # noqa: BLE001 - the database away: the loop's next acquire says so
                log.warning("%s: cannot renew the lease", self.name, exc_info=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # noqa: BLE001 - a bad tick (the database away) must not end the loop
                log.exception("%s tick failed; retrying", self.name)
            self._wake.wait(self.poll_s)
            self._wake.clear()
