"""A deadline on a call that nothing can interrupt, enforced by ending the process.

``ray.init`` joining an address that accepts TCP and never answers blocks in Ray's C++ core (its GCS client
retries for minutes with the GIL released, so a Python signal handler, a SIGTERM's included, runs only when it
returns: 80 s measured). Past the deadline a watchdog thread reports the failure (``expire``) and ends the
process with exit code 1, killing every process it started first (a local Ray node's GCS and raylet would
outlive it): nothing of the job is left running, and the job's outcome is the event ``expire`` wrote.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

#: the process's exit code when the deadline ends it: a failure of the machine (``infra``), as ``tokenmill run``'s
EXIT_FAILURE = 1


@contextlib.contextmanager
def process_deadline(seconds: float, expire: Callable[[], None]) -> Iterator[None]:
    """Run the block; if it still runs after ``seconds``, call ``expire`` on a watchdog thread, then end the
    process and its descendants (:func:`exit_with_descendants`). Whichever comes first, the block's end or the
    deadline, decides: a block that ends while ``expire`` runs waits for the process to end."""
    decided = threading.Lock()

    def fire() -> None:
        if not decided.acquire(blocking=False):
            return  # the block ended first
        try:
            expire()
        finally:
            exit_with_descendants(EXIT_FAILURE)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        if decided.acquire(blocking=False):
            timer.cancel()
        else:  # the deadline won: the watchdog is reporting and will end the process
            threading.Event().wait()


def exit_with_descendants(code: int) -> None:
    """SIGKILL every process this one started (children, theirs, found in ``/proc``), then ``os._exit(code)``."""
    for pid in _descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    os._exit(code)


def _descendants(root: int) -> list[int]:
    parent: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            parent[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])  # after "(comm)": state ppid
        except (OSError, ValueError):
            continue
    found, frontier = [], [root]
    while frontier:
        kids = [pid for pid, ppid in parent.items() if ppid in frontier]
        found += kids
        frontier = kids
    return found
