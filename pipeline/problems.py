"""What is wrong with a spec, as data: one :class:`Problem` per field, from the first check to the last reader.

Every check (the schema, a stage's parameters, the files a spec names, the service's rules) reports
:class:`Problem` records; the CLI prints them as ``field: message`` lines and the API returns them as 422
``detail`` items (``{loc, msg, type}``). Nothing turns a message back into a field: a problem keeps its
``loc`` from where it was found to where it is shown.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from dataclasses import field as dc_field
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

M = TypeVar("M", bound=BaseModel)
#: a field path: names and list indexes, as pydantic's ``loc`` (``("stages", 0, "params", "min_chars")``)
Loc = tuple[str | int, ...]

#: ``kind`` of a path or glob that matches no file (yet): an input, a benchmark. A schedule accepts it, since
#: each of its runs checks the files it reads.
NO_MATCH = "no_match"
#: ``kind`` of any other disagreement between a valid spec and the filesystem (a missing tokenizer file)
PREFLIGHT = "preflight"
#: ``kind`` of a spec's own checks across fields (an unknown stage, two stages annotating one key)
SPEC = "spec"
#: ``kind`` of a stage parameter's rule that compares it with another of the stage's params (near_dedup's bands x
#: rows <= num_perm): the only rules of a stage's ``params`` the API's OpenAPI schema does not state
ACROSS_PARAMS = "params_across"
#: pydantic's ``kind`` of a key a model does not have (``extra="forbid"``)
UNKNOWN_KEY = "extra_forbidden"
#: ``kind`` of a spec file that cannot be read or parsed: its message starts with the file's name (and, for a
#: syntax error, ``:LINE:COL``), which stands in for the field
SPEC_FILE = "spec_file"


@dataclass(frozen=True)
class Problem:
    """One reason a spec cannot run: where (``loc``, relative to the spec), why (``msg``), and what kind
    (``kind``: pydantic's error type for a schema error, else one of this module's names or the check's own).

    ``line``: where the field is in the spec's YAML file, when it came from one (shown, never compared: two
    problems at one field are equal wherever the file had it)."""

    loc: Loc
    msg: str
    kind: str = SPEC
    line: int | None = dc_field(default=None, compare=False)

    @property
    def field(self) -> str:
        """``loc`` joined with dots (``stages.0.params.min_chars``); ``spec`` for the spec as a whole."""
        return ".".join(str(p) for p in self.loc) or "spec"

    def __str__(self) -> str:
        if self.kind == SPEC_FILE and not self.loc:
            return self.msg
        return f"{self.field}{f' (line {self.line})' if self.line else ''}: {self.msg}"

    def under(self, *prefix: str | int) -> Problem:
        """The same problem with ``prefix`` before its ``loc`` (a spec inside a stage, a body)."""
        return Problem((*prefix, *self.loc), self.msg, self.kind, self.line)

    def at_line(self, line: int) -> Problem:
        """The same problem, shown with the YAML ``line`` of its field."""
        return replace(self, line=line)

    def detail(self, *prefix: str | int) -> dict[str, Any]:
        """A FastAPI 422 ``detail`` item: ``{"loc": [*prefix, *loc], "msg": ..., "type": kind}``."""
        return {"loc": [*prefix, *self.loc], "msg": self.msg, "type": self.kind}


class ParamError(ValueError):
    """A stage parameter that cannot be used, raised by a ``Params`` validator or a stage's ``preflight``.

    ``str()`` is ``param: message`` (what a caller printing the exception shows); :mod:`pipeline.spec` and
    :mod:`pipeline.preflight` place it under the stage as ``stages.<i>.params.<param>``. Without a ``kind``,
    the check that caught it names one (``value_error`` when parsing, :data:`PREFLIGHT` in preflight)."""

    def __init__(self, param: str | Loc, msg: str, kind: str | None = None):
        self.loc: Loc = (param,) if isinstance(param, str) else tuple(param)
        self.msg = msg
        self.kind = kind
        super().__init__(str(Problem(self.loc, msg)))

    def problem(self, prefix: Loc, kind: str) -> Problem:
        """The problem at ``prefix`` + its parameter; ``kind`` unless it was raised with its own."""
        return Problem((*prefix, *self.loc), self.msg, self.kind or kind)


class SpecError(ValueError):
    """What was given (a job spec, the service's settings) cannot be used: ``problems``, one per field;
    ``str()`` is one ``field: message`` line each."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems: list[Problem] = list(problems)
        super().__init__(format_problems(self.problems))

    @classmethod
    def one(cls, loc: Loc, msg: str, kind: str = SPEC) -> SpecError:
        return cls([Problem(loc, msg, kind)])


def format_problems(problems: Iterable[Problem]) -> str:
    """One ``field: message`` line per problem."""
    return "\n".join(str(p) for p in problems)


def from_pydantic(err: Any) -> Problem:
    """One of pydantic's errors (``ValidationError.errors()`` item) as a :class:`Problem`.

    A validator's own ``ValueError`` is read from ``ctx["error"]`` (its message without pydantic's prefix); a
    :class:`ParamError` adds its parameter to the ``loc``."""
    loc: Loc = tuple(err.get("loc", ()))
    kind = str(err.get("type", "value_error"))
    raised = (err.get("ctx") or {}).get("error")
    if kind == "value_error" and isinstance(raised, ParamError):
        return raised.problem(loc, kind)
    if kind == "value_error" and isinstance(raised, Exception):
        return Problem(loc, str(raised), kind)
    return Problem(loc, str(err.get("msg", "")), kind)


def problems_of(exc: ValidationError, model: type[BaseModel] | None = None) -> list[Problem]:
    """Every error of ``exc`` as a :class:`Problem`; with the ``model`` that was validated, an unknown key names
    the closest key the model has at that place (:func:`unknown_key`) instead of pydantic's "Extra inputs are not
    permitted"."""
    problems = [from_pydantic(err) for err in exc.errors()]
    if model is None:
        return problems
    return [unknown_key(p, model) if p.kind == UNKNOWN_KEY else p for p in problems]


def unknown_key(problem: Problem, model: type[BaseModel]) -> Problem:
    """``problem`` (an unknown key at its ``loc`` below ``model``) saying which key was likely meant
    (``unknown key; did you mean 'min_words'?``), or which keys there are when none is close; as it was when
    the place is no model's (a mapping of any keys, a stage's ``params`` seen from the spec: the stage's own
    check has said it)."""
    found = _model_at(model, problem.loc[:-1]) if problem.loc else None
    if found is None or not isinstance(problem.loc[-1], str):
        return problem
    keys = [f.alias or name for name, f in found.model_fields.items()]
    close = difflib.get_close_matches(problem.loc[-1], keys, n=1, cutoff=0.6)
    msg = f"unknown key; did you mean {close[0]!r}?" if close else f"unknown key (known: {', '.join(keys)})"
    return replace(problem, msg=msg)


def _model_at(annotation: Any, loc: Loc) -> type[BaseModel] | None:
    """The model that ``annotation`` holds at ``loc`` (a pydantic error's path: field names, list indexes, mapping
    keys, a union member's name), None where that is no model."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _model_at(args[0], loc)
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        named = [a for a in members if loc and getattr(a, "__name__", None) == loc[0]]
        if named:  # pydantic names the member of a union of models it tried
            return _model_at(named[0], loc[1:])
        return next((m for m in (_model_at(a, loc) for a in members) if m is not None), None)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if not loc:
            return annotation
        by_key = {f.alias or name: f for name, f in annotation.model_fields.items()}
        field = by_key.get(loc[0]) if isinstance(loc[0], str) else None
        return _model_at(field.annotation, loc[1:]) if field is not None else None
    if loc and origin in (list, tuple, dict) and args:  # an item or a value: the path's next part is its index or key
        return _model_at(args[-1] if origin is dict or len(args) == 1 or args[1] is Ellipsis else args[0], loc[1:])
    return None


def parse_model(model: type[M], data: Any) -> M:
    """``data``, a mapping, validated as ``model`` (a job spec, a mixture spec); :class:`SpecError` names every
    field that is wrong."""
    if not isinstance(data, dict):
        raise SpecError.one((), "must be a mapping", "model_type")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(problems_of(exc, model)) from None


def across_params(msg: str) -> PydanticCustomError:
    """A ``Params`` validator's error for a rule comparing two params (kind :data:`ACROSS_PARAMS`), at the params
    as a whole."""
    return PydanticCustomError(ACROSS_PARAMS, msg.replace("{", "{{").replace("}", "}}"))


def validation_error(title: str, problems: Sequence[Problem], value: Any = None) -> ValidationError:
    """``problems`` as one pydantic ``ValidationError``. Raised inside a validator, pydantic merges its errors
    into the outer model's, each at its own ``loc`` below the validated value and with its own message."""
    return ValidationError.from_exception_data(title, [
        InitErrorDetails(type=PydanticCustomError(p.kind, p.msg), loc=p.loc, input=value) for p in problems])
