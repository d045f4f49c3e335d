"""The one error a job fails with: one clear line and a category (``events.FailureCategory``).

Phases, tasks and checks raise :class:`JobError`; whatever else a job ends with (an output folder's
refusal, an OS error however deep Ray wrapped it, a signal, a bug) becomes one in :func:`as_job_error`,
so every failure is reported the same way: one ``job_failed`` event, one line.
"""

from __future__ import annotations

from typing import get_args

from pipeline.job.events import FailureCategory
from pipeline.output.layout import OutputError, describe_os_error, os_error_category

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


def first_line(exc: BaseException) -> str:
    """``exc``'s message up to its first line break (Ray's errors carry a traceback after it)."""
    return (str(exc).strip().splitlines() or [""])[0]


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception behind it: causes, contexts and a ``RayTaskError``'s ``cause`` (what the
    task raised; Ray Data raises it as is: ``raise_original_map_exception`` in ``ray_env``)."""
    seen: list[BaseException] = []
    todo: list[object] = [exc]
    while todo:
        e = todo.pop(0)
        if isinstance(e, BaseException) and all(e is not s for s in seen):
            seen.append(e)
            todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return seen


def os_error_in(exc: BaseException) -> OSError | None:
    """The OS error behind ``exc``: the first in its chain that has an errno (Ray's ``RayTaskError(OSError)``
    copies have none), else the first at all."""
    found = [e for e in _chain(exc) if isinstance(e, OSError)]
    return next((e for e in found if e.errno is not None), found[0] if found else None)


def as_job_error(exc: BaseException, phase: str | None,
                 user_errors: tuple[type[BaseException], ...] = ()) -> JobError:
    """What a job ended with, as one :class:`JobError`: a JobError as it is; a signal (KeyboardInterrupt) a
    cancel; an output folder's refusal with its category; ``user_errors`` (a tokenizer that does not fit the
    spec) ``validation``; an OS error anywhere in the chain by :func:`os_error_category` (a full disk, EDQUOT,
    EFBIG, EIO: ``infra``); anything else ``app``, named by its phase, type and first line."""
    where = phase or "start"
    while isinstance(getattr(exc, "cause", None), BaseException):  # a RayTaskError: what the task raised
        exc = exc.cause  # type: ignore[attr-defined]
    if isinstance(exc, JobError):
        return exc
    if isinstance(exc, KeyboardInterrupt):
        return JobCancelled(f"cancelled during {where}")
    if isinstance(exc, OutputError):
        return JobError(str(exc), failure_category(exc.category))
    if isinstance(exc, user_errors):
        return JobError(first_line(exc), "validation")
    os_exc = os_error_in(exc)
    if os_exc is not None:
        # a file name with a line break is Ray Data's retry note, appended to the error's arguments
        named = any(isinstance(f, str) and "\n" not in f for f in (os_exc.filename, os_exc.filename2))
        message = describe_os_error(os_exc) if named else f"{where}: {os_exc.strerror or first_line(os_exc)}"
        return JobError(message, failure_category(os_error_category(os_exc)))
    return JobError(f"{where}: {type(exc).__name__}: {first_line(exc)}", "app")
