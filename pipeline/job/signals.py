"""SIGINT / SIGTERM cancel a job: the one handler behind ``tokenmill run`` and the service's job processes."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Protocol

#: like a shell's exit code for a process stopped by SIGINT
EXIT_CANCELLED = 130


class Cancellable(Protocol):
    """What a signal stops: a :class:`pipeline.job.engine.Job`."""

    def cancel(self) -> bool | None:
        """Ask it to stop; False: too late (it publishes its output), the signal is ignored."""


@contextlib.contextmanager
def cancel_on_signals(job: Cancellable, on_cancel: Callable[[], None] | None = None) -> Iterator[None]:
    """The first SIGINT or SIGTERM asks ``job`` to cancel (it stops within seconds and publishes nothing) and
    interrupts whatever the driver is blocked in (a dedup stage's ``ray.get``, Ray Data's iterator): the engine
    turns that KeyboardInterrupt into JobCancelled; once the job publishes (its ``cancel()`` says False) the
    signal is ignored. A second signal exits at once with 130. The previous
    handlers come back afterwards; off the main thread (where signals cannot be caught) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    count = 0

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal count
        count += 1
        if count > 1:
            os.write(sys.stderr.fileno(), b"cancelled: stopped at once (second signal)\n")
            os._exit(EXIT_CANCELLED)
        if job.cancel() is False:  # publishing: cancel and publish are one decision, taken already
            return
        if on_cancel is not None:
            on_cancel()
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
