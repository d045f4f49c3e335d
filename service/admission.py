"""Whether the service accepts a spec: the checks between a valid :class:`~pipeline.spec.JobSpec` and a job.

Kept apart from the API so that anything else that creates jobs (the scheduler) applies the same rules:

- 422 when a string of the spec holds U+0000 (:func:`nul_problems`): PostgreSQL text and JSONB cannot store it,
  SQLite can, so it is refused here, before any store, with the field's path;
- 403 when a path falls outside the configured roots (:mod:`service.confine`);
- 422 when ``execution.address`` names another Ray than the service's (the service decides where jobs run),
  when ``execution.num_cpus`` or ``execution.parallelism`` asks more CPUs than the service lets one job have
  (:attr:`~service.settings.Settings.job_cpu_cap`: ``--max-job-cpus``; ``--job-cpus`` is only the default),
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

#: why a string with U+0000 is refused, wherever it is in a request
NUL_MESSAGE = "U+0000 (NUL) is not allowed in text"


def nul_problems(value: Any, loc: Loc = ()) -> list[Problem]:
    """One problem per string (or mapping key) under ``value`` that holds U+0000, at its path."""
    if isinstance(value, str):
        return [Problem(loc, NUL_MESSAGE, "nul_character")] if "\x00" in value else []
    if isinstance(value, dict):
        found = [Problem((*loc, key), "a key with U+0000 (NUL) is not allowed", "nul_character")
                 for key in value if "\x00" in key]
        return found + [p for key, v in value.items() for p in nul_problems(v, (*loc, key))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in nul_problems(v, (*loc, i))]
    return []


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
    nul = nul_problems(spec.model_dump(mode="json"))
    if nul:
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, nul)
    if spec.execution.address and spec.execution.address != settings.ray_address:
        where = settings.ray_address or "a local Ray per job"
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, [Problem(
            ("execution", "address"), f"this service runs jobs on {where}; leave execution.address out",
            "address_not_allowed")])
    above = cpu_problems(spec, settings.job_cpu_cap)
    if above:
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, above)
    refused = confine.problems(spec, settings.roots())
    if refused:
        raise Refused(status.HTTP_403_FORBIDDEN, [Problem(p.loc, p.msg, "path_not_allowed") for p in refused])
    found = preflight_problems(spec)
    if found:
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, found)


def cpu_problems(spec: JobSpec, cap: int | None) -> list[Problem]:
    """``execution.num_cpus`` (a local Ray's size) and ``execution.parallelism`` (workers per stage, one CPU
    each; some pools reserve none, so only this bounds them) above ``cap``: one problem each."""
    if cap is None:
        return []
    ex = spec.execution
    return [Problem(("execution", name), f"{value} is more than the {cap} CPUs this service lets one job use "
                                         "(tokenmill serve --max-job-cpus)", "cpus_above_limit")
            for name, value in (("num_cpus", ex.num_cpus), ("parallelism", ex.parallelism))
            if value is not None and value > cap]
