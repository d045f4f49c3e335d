"""Whether the service accepts a spec: the checks between a valid :class:`~pipeline.spec.JobSpec` and a job.

Kept apart from the routes so that anything else that creates jobs (a scheduler) applies the same rules:

- 403 when a path falls outside the configured roots (:mod:`service.confine`);
- 422 when ``execution.address`` names another Ray than the service's (the service decides where jobs run),
  or when the filesystem disagrees with the spec (:func:`pipeline.preflight.problems`: no file matches an
  input, a missing tokenizer or model file).
"""

from __future__ import annotations

from typing import Any

from fastapi import status

from pipeline.spec import JobSpec
from service import confine
from service.api.settings import Settings


class Refused(Exception):
    """A spec the service will not run: an HTTP status and one problem per field."""

    def __init__(self, status_code: int, problems: list[dict[str, Any]]):
        super().__init__("; ".join(p["msg"] for p in problems))
        self.status_code = status_code
        self.problems = problems


def _problem(loc: tuple[str | int, ...] | list[str | int], msg: str, kind: str) -> dict[str, Any]:
    return {"loc": ["body", *loc], "msg": msg, "type": kind}


def split_path(line: str) -> tuple[list[str | int], str]:
    """``("inputs.0.path: no file ...")`` -> ``(["inputs", 0, "path"], "no file ...")``."""
    where, sep, msg = line.partition(": ")
    if not sep or " " in where:
        return [], line
    return [int(p) if p.isdigit() else p for p in where.split(".")], msg


def admit(spec: JobSpec, settings: Settings) -> None:
    """Return when the service will run ``spec``; raise :class:`Refused` otherwise."""
    if spec.execution.address and spec.execution.address != settings.ray_address:
        where = settings.ray_address or "a local Ray per job"
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, [_problem(
            ("execution", "address"), f"this service runs jobs on {where}; leave execution.address out",
            "address_not_allowed")])
    refused = confine.problems(spec, settings.roots())
    if refused:
        raise Refused(status.HTTP_403_FORBIDDEN, [_problem(p.loc, p.msg, "path_not_allowed") for p in refused])
    from pipeline.preflight import problems

    found = problems(spec)
    if found:
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT,
                      [_problem(*split_path(line), "preflight") for line in found])
