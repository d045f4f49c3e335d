"""The one error a job fails with: one clear line and a category (``events.FailureCategory``).

Phases, tasks and checks raise :class:`JobError`; the engine turns what else it can name (an output
folder's refusal, an OS error, a signal) into one before it reports the failure.
"""

from __future__ import annotations

from typing import get_args

from pipeline.job.events import FailureCategory

_CATEGORIES: dict[str, FailureCategory] = {c: c for c in get_args(FailureCategory)}


def failure_category(name: str) -> FailureCategory:
    """``name`` as a failure category (a category named by another module's error); unknown ones are ``app``."""
    return _CATEGORIES.get(name, "app")


class JobError(RuntimeError):
    """A job that cannot finish: one clear line, and a category (see ``events.FailureCategory``)."""

    category: FailureCategory = "app"

    def __init__(self, message: str, category: FailureCategory | None = None):
        super().__init__(message)
        if category is not None:
            self.category = category


class JobCancelled(JobError):
    category: FailureCategory = "cancelled"
