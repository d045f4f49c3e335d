"""Whether the service accepts a spec: the checks between a valid :class:`~pipeline.spec.JobSpec` and a job.

Kept apart from the API so that anything else that creates jobs (the scheduler) applies the same rules:

- 403 when a path falls outside the configured roots (:mod:`service.confine`);
- 422 when ``execution.address`` names another Ray than the service's (the service decides where jobs run),
  or when the filesystem disagrees with the spec (:func:`pipeline.preflight.problems`: no file matches an
  input, a missing tokenizer or model file).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import status

from pipeline.preflight import problems as preflight_problems
from pipeline.problems import Loc, Problem, SpecError
from pipeline.spec import JobSpec
from service import confine
from service.settings import Settings


class Refused(SpecError):
    """A spec the service will not run: an HTTP status and one :class:`~pipeline.problems.Problem` per field.

    ``at`` is where the spec lies in the request (``("body",)`` for a job, ``("body", "spec")`` for a
    schedule): the API's 422/403 ``detail`` items are the problems' :meth:`~pipeline.problems.Problem.detail`
    below it."""

    def __init__(self, status_code: int, problems: Sequence[Problem], at: Loc = ("body",)):
        super().__init__(problems)
        self.status_code = status_code
        self.at = at

    def details(self) -> list[dict[str, Any]]:
        """The API's ``detail`` items."""
        return [p.detail(*self.at) for p in self.problems]


def admit(spec: JobSpec, settings: Settings) -> None:
    """Return when the service will run ``spec``; raise :class:`Refused` otherwise."""
    if spec.execution.address and spec.execution.address != settings.ray_address:
        where = settings.ray_address or "a local Ray per job"
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, [Problem(
            ("execution", "address"), f"this service runs jobs on {where}; leave execution.address out",
            "address_not_allowed")])
    refused = confine.problems(spec, settings.roots())
    if refused:
        raise Refused(status.HTTP_403_FORBIDDEN, [Problem(p.loc, p.msg, "path_not_allowed") for p in refused])
    found = preflight_problems(spec)
    if found:
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, found)
