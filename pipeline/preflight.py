"""Checks of a valid spec against the filesystem, before any work starts.

Kept apart from :mod:`pipeline.spec` (pure schema) so that parsing a spec stays cheap and importable
anywhere; the CLI and the control plane call :func:`check_spec` before they start a job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline import storage
from pipeline.problems import NO_MATCH, PREFLIGHT, ParamError, Problem, SpecError
from pipeline.readers import expand_inputs
from pipeline.spec import JobSpec, load_spec, parse_spec
from pipeline.stages import StageContext, stage_class


def problems(spec: JobSpec) -> list[Problem]:
    """Every problem found, each at its field: an input that matches no file (kind :data:`NO_MATCH`), a
    stage's ``preflight`` refusal, a missing tokenizer file."""
    found = [Problem(("inputs", i, "path"), f"no file matches {inp.path!r}", NO_MATCH)
             for i, inp in enumerate(spec.inputs) if not expand_inputs([inp])]
    for i, stage in enumerate(spec.stages):
        cls = stage_class(stage.type)
        try:
            cls(spec.stage_params(i), StageContext(spec.name, spec.output.path, i + 1, "")).preflight()
        except ParamError as exc:
            found.append(exc.problem(("stages", i, "params"), PREFLIGHT))
        except ValueError as exc:  # a stage that names no parameter: the stage's params as a whole
            found.append(Problem(("stages", i, "params"), str(exc), PREFLIGHT))
    if spec.tokenizer and spec.tokenizer.path and not storage.is_file(spec.tokenizer.path):
        found.append(Problem(("tokenizer", "path"), f"no such file {spec.tokenizer.path!r}", PREFLIGHT))
    return found


def check_spec(spec: JobSpec) -> JobSpec:
    """``spec`` itself when the filesystem agrees with it, else :class:`SpecError` listing why."""
    found = problems(spec)
    if found:
        raise SpecError(found)
    return spec


def checked(data: Any) -> JobSpec:
    """:func:`pipeline.spec.parse_spec` then :func:`check_spec`."""
    return check_spec(parse_spec(data))


def load_checked(path: str | Path) -> JobSpec:
    """:func:`pipeline.spec.load_spec` then :func:`check_spec`."""
    return check_spec(load_spec(path))
