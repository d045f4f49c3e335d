"""Whether the service accepts a spec: the checks between a valid :class:`~pipeline.spec.JobSpec` and a job.

Kept apart from the API so that anything else that creates jobs (the scheduler) applies the same rules:

- 422 when a string of the spec holds U+0000 (:func:`nul_problems`): PostgreSQL text and JSONB cannot store it,
  SQLite can, so it is refused here, before any store, with the field's path;
- 403 when a path falls outside the configured roots (:mod:`service.confine`);
- 422 when ``execution.address`` names another Ray than the service's (the service decides where jobs run),
  when ``execution.num_cpus`` or ``execution.parallelism`` asks more CPUs than the service lets one job have
  (:attr:`~service.settings.Settings.job_cpu_cap`: ``--max-job-cpus``; ``--job-cpus`` is only the default),
  or when the filesystem disagrees with the spec (:func:`pipeline.preflight.problems`: no file matches an
  input, a missing tokenizer or model file);
- the output folder, as ``tokenmill run`` checks it before any work (:func:`output_refusal`, read-only: nothing
  is created or locked): 422 when it overlaps an input; 409 when it holds an earlier run's output and
  ``output.overwrite`` is not set, an unfinished job of another spec, or files tokenmill did not write. What
  is on disk now decides: a job queued behind another on the same folder is admitted, and the engine's claim
  refuses it later if that one publishes first. A schedule's folder holds versions, not an output: its own
  checks apply (``versioned``, :func:`service.api.routers.schedules.check_spec`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import status

from pipeline import storage
from pipeline.job.state import StateError, WorkState
from pipeline.output.layout import EarlierOutput, OutputError
from pipeline.output.open_store import check_not_overlapping, open_output_dir
from pipeline.preflight import problems as preflight_problems
from pipeline.preflight import readable_problems
from pipeline.problems import Loc, Problem, SpecError
from pipeline.spec import JobSpec
from service import confine, ownership
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


def admit(spec: JobSpec, settings: Settings, *, versioned: bool = False, team: str | None = None,
          scope: str | None = None) -> None:
    """Return when the service will run ``spec``; raise :class:`Refused` otherwise. ``versioned``: the spec is
    a schedule's, whose output folder holds versions (the schedule checks it itself). ``team``: the team the job
    writes as (None: no folder's owner is asked); ``scope``: the team whose roots and folders it may read and
    write (None: every team's, an admin's)."""
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
    refused = confine.problems(spec, settings.roots(scope))
    if refused:
        raise Refused(status.HTTP_403_FORBIDDEN, [Problem(p.loc, p.msg, "path_not_allowed") for p in refused])
    foreign = ownership.problems(spec, writer=team, reader=scope)
    if foreign:
        raise Refused(status.HTTP_403_FORBIDDEN, foreign)
    found = preflight_problems(spec)
    if found:
        raise Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, found)
    refusal = None if versioned else output_refusal(spec)
    if refusal is not None:
        raise refusal


def beside_schema(data: Any, settings: Settings) -> list[Problem]:
    """The file checks of a body that failed its schema, so a submission is refused in one round (as
    ``tokenmill run`` refuses a spec file): an input matching nothing comes with the unknown stage type.

    Only parts whose paths lie inside the roots are looked at; one outside gets no file check (whether a file
    exists there is not this service's to say), and the 403 comes once the schema holds."""
    if not isinstance(data, dict):
        return []
    roots = settings.roots()
    safe = dict(data)
    if isinstance(data.get("inputs"), list):
        safe["inputs"] = [i if isinstance(i, dict) and confine.readable(i.get("path"), roots) else None
                          for i in data["inputs"]]
    if isinstance(data.get("stages"), list):
        safe["stages"] = [st if _paths_readable(st, roots) else None for st in data["stages"]]
    tok = data.get("tokenizer")
    if isinstance(tok, dict) and tok.get("path") is not None and not confine.readable(tok["path"], roots):
        safe["tokenizer"] = None
    return readable_problems(safe)


def _paths_readable(stage: Any, roots: confine.Roots) -> bool:
    """A stage entry whose path parameters (``dedup_against``...) all lie inside the roots."""
    if not isinstance(stage, dict) or not isinstance(params := stage.get("params", {}), dict):
        return False
    try:
        return all(v is None or confine.readable(v, roots)
                   for _, v in confine.stage_path_values(str(stage.get("type")), params))
    except (KeyError, ValueError):
        return False


def output_refusal(spec: JobSpec) -> Refused | None:
    """What the engine would refuse about ``output.path`` when the job starts (:class:`Refused` naming it), asked
    now with the engine's own checks, read-only: the overlap with the inputs
    (:func:`~pipeline.output.open_store.check_not_overlapping`), the folder's ownership and earlier output
    (``check_claim``), and the work folder's spec (:meth:`~pipeline.job.state.WorkState.open`)."""
    out_path, overwrite = spec.output.path, spec.output.overwrite
    try:
        check_not_overlapping(out_path, [inp.path for inp in spec.inputs])
    except OutputError as exc:
        return Refused(status.HTTP_422_UNPROCESSABLE_CONTENT, [_output_problem(exc, "output_overlaps_input")])
    if storage.is_remote(out_path):
        # an object store is asked over the network (its foreign check lists the whole prefix): not inside a
        # request; the job's claim refuses the same when it starts
        return None
    out = open_output_dir(out_path)
    try:
        out.check_claim(overwrite)
        if not overwrite:  # with it, the engine removes another spec's work
            WorkState.open(out.work, spec.content_hash())
    except EarlierOutput as exc:
        return Refused(status.HTTP_409_CONFLICT, [_output_problem(exc, "output_exists")])
    except StateError as exc:
        return Refused(status.HTTP_409_CONFLICT, [_output_problem(exc, "output_unfinished_job")])
    except OutputError as exc:
        return Refused(status.HTTP_409_CONFLICT, [_output_problem(exc, "output_not_usable")])
    except OSError as exc:  # a folder on the way that cannot be read
        return Refused(status.HTTP_409_CONFLICT, [Problem(
            ("output", "path"), f"cannot read {out_path}: {exc.strerror or exc}", "output_not_usable")])
    return None


def _output_problem(exc: OutputError | StateError, kind: str) -> Problem:
    """The engine's one line (``output.path: ...``) as a problem at ``output.path``."""
    return Problem(("output", "path"), str(exc).removeprefix("output.path: "), kind)


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
