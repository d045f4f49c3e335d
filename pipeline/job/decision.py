"""Cancel and publish are one decision: a job's cancel flag and its commit, under one lock.

A cancel that lands while the output is committed would leave a job reported cancelled whose output is published
(in the service: a CANCELLED job whose retries are refused, "already holds a shard set", and whose artifacts are
never served). So the commit is decided once: a service's answer first (``may_publish``, see
:mod:`service.runner.publish`: refused when the service accepted a cancel), then the cancel flag, under the lock
:meth:`CancelOrPublish.cancel` takes; from then on a cancel is refused (``cancel()`` says False and
:mod:`pipeline.job.signals` ignores the signal), so a cancelled job has published nothing and a publishing one
ends done.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.job.errors import JobCancelled

#: a test hook (tests/test_cancel_publish.py): ``POINT:FILE`` makes the job wait at POINT (``publish``: before it
#: publishes; ``published``: after its commit, before it reports) until FILE exists, ``FILE.waiting`` saying it waits
TEST_PAUSE_ENV = "TOKENMILL_TEST_PAUSE"


class CancelOrPublish:
    """One job's cancel flag and the decision to publish; ``cancel()`` may come from any thread or a signal handler."""

    def __init__(self, may_publish: Callable[[], bool] | None = None):
        #: asked before the commit (a service's decision); False: a cancel came first
        self.may_publish = may_publish
        self._lock = threading.RLock()  # reentrant: a signal handler may run cancel() while this thread holds it
        self._cancel = threading.Event()
        self._publishing = False

    def cancel(self) -> bool:
        """Ask the job to stop; False (and ignored) once it publishes."""
        with self._lock:
            if self._publishing:
                return False
            self._cancel.set()
            return True

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def publish(self, commit: Callable[[], object], check_cancel: Callable[[], None]) -> None:
        """``commit()`` unless the service refuses (JobCancelled) or a cancel came first (``check_cancel`` raises)."""
        pause_for_tests("publish")
        if self.may_publish is not None and not self.may_publish():
            raise JobCancelled("cancelled before publishing")
        with self._lock:
            check_cancel()
            self._publishing = True
        commit()
        pause_for_tests("published")


def pause_for_tests(point: str) -> None:
    at, _, path = os.environ.get(TEST_PAUSE_ENV, "").partition(":")
    if at != point or not path:
        return
    Path(f"{path}.waiting").touch()
    while not os.path.exists(path):
        time.sleep(0.05)
