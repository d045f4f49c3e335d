"""Checks of a spec against the filesystem, before any work starts.

Kept apart from :mod:`pipeline.spec` (pure schema) so that parsing a spec stays cheap and importable
anywhere; the CLI and the control plane call :func:`check_spec` before they start a job.

A spec is refused in one round: when its schema fails, the file checks of every part that could still be read
(an input, a stage, the tokenizer) come with the schema's problems (:func:`checked`, :func:`load_checked`), so an
unknown stage type and an input that matches nothing are two lines of one run, not two runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from pipeline import storage
from pipeline.problems import NO_MATCH, PREFLIGHT, ParamError, Problem, SpecError
from pipeline.readers import expand_inputs
from pipeline.secret_fields import placeholder_problems
from pipeline.spec import InputSpec, JobSpec, StageSpec, TokenizerSpec, parse_spec, read_spec_file, with_lines
from pipeline.stages import StageContext, stage_class


def problems(spec: JobSpec) -> list[Problem]:
    """Every problem found, each at its field: an input that matches no file (kind :data:`NO_MATCH`), a
    stage's ``preflight`` refusal, a missing tokenizer file; and a secret that is only the ``<redacted>`` a
    response showed (:func:`pipeline.secret_fields.placeholder_problems`), checked here, where every runner
    checks a spec before it starts, since the schema lets it through for a schedule's update to keep its value."""
    return placeholder_problems(spec.model_dump(mode="json")) + _file_problems(
        spec.name, spec.output.path, enumerate(spec.inputs), enumerate(spec.stages), spec.tokenizer)


def readable_problems(data: Any) -> list[Problem]:
    """The file checks of :func:`problems` on each part of ``data`` (a spec that failed its schema) that is
    valid on its own: an input entry, a stage (type and params), the tokenizer. A part that is not valid gets
    none: its schema problem is what to fix first."""
    if not isinstance(data, dict):
        return []
    out = data.get("output")
    out_path = out.get("path") if isinstance(out, dict) else None
    name = data.get("name")
    tok = _valid(TokenizerSpec, data.get("tokenizer")) if data.get("tokenizer") is not None else None
    return _file_problems(name if isinstance(name, str) else "", out_path if isinstance(out_path, str) else "",
                          _valid_items(InputSpec, data.get("inputs")), _valid_items(StageSpec, data.get("stages")),
                          tok if isinstance(tok, TokenizerSpec) else None)


def _valid(model: type[BaseModel], value: Any) -> BaseModel | None:
    try:
        return model.model_validate(value)
    except (ValidationError, ValueError):
        return None


def _valid_items(model: type[BaseModel], values: Any) -> list[tuple[int, Any]]:
    """``(index, model)`` of each item of the list ``values`` that is a valid ``model``."""
    items = [(i, _valid(model, v)) for i, v in enumerate(values)] if isinstance(values, list) else []
    return [(i, m) for i, m in items if m is not None]


def _file_problems(name: str, output_path: str, inputs: Iterable[tuple[int, InputSpec]],
                   stages: Iterable[tuple[int, StageSpec]], tokenizer: TokenizerSpec | None) -> list[Problem]:
    found = [p for i, inp in inputs for p in input_problems(inp, ("inputs", i, "path"))]
    for i, stage in stages:
        cls = stage_class(stage.type)
        try:
            cls(stage.validated, StageContext(name, output_path, i + 1, "")).preflight()
        except ParamError as exc:
            found.append(exc.problem(("stages", i, "params"), PREFLIGHT))
        except ValueError as exc:  # a stage that names no parameter: the stage's params as a whole
            found.append(Problem(("stages", i, "params"), str(exc), PREFLIGHT))
    if tokenizer and tokenizer.path and not storage.is_file(tokenizer.path):
        found.append(Problem(("tokenizer", "path"), f"no such file {tokenizer.path!r}", PREFLIGHT))
    return found


def input_problems(inp: InputSpec, loc: tuple[str | int, ...]) -> list[Problem]:
    """The input's problem, at ``loc``: it matches no file, or its store cannot be asked (a remote input: one line
    with the store's reason, not the client's traceback); none when it names files."""
    try:
        matched = expand_inputs([inp])
    except storage.StorageError as exc:
        return [Problem(loc, str(exc), PREFLIGHT)]
    return [] if matched else [Problem(loc, f"no file matches {inp.path!r}", NO_MATCH)]


def check_spec(spec: JobSpec) -> JobSpec:
    """``spec`` itself when the filesystem agrees with it, else :class:`SpecError` listing why."""
    found = problems(spec)
    if found:
        raise SpecError(found)
    return spec


def checked(data: Any) -> JobSpec:
    """:func:`pipeline.spec.parse_spec` then :func:`check_spec`; when the schema fails, its problems and those
    of :func:`readable_problems`, in one :class:`SpecError`."""
    try:
        spec = parse_spec(data)
    except SpecError as exc:
        raise SpecError(exc.problems + readable_problems(data)) from None
    return check_spec(spec)


def load_checked(path: str | Path) -> JobSpec:
    """:func:`checked` on the spec file at ``path`` (read as :func:`pipeline.spec.load_spec` reads it), every
    problem with its YAML line."""
    data, lines = read_spec_file(Path(path))
    try:
        return checked(data)
    except SpecError as exc:
        raise SpecError(with_lines(exc.problems, lines)) from None
