"""Secret spec fields: declared once, in the schema, and found by one walk everywhere a spec leaves the service.

A field is a secret when its type is :data:`Secret` (today the ``pii`` stage's ``salt``: whoever holds it can
confirm a guess against an ``<EMAIL_ADDRESS:3fa2c1d9>`` hash). The mark is in the field's JSON schema
(``writeOnly: true``, ``x-secret: true``), so a new reader or stage parameter that takes a key or a token is
a secret by its type alone. A spec takes no storage credential: those come from the environment
(:mod:`pipeline.storage`).

:func:`secrets_of` walks a spec's JSON data (a :class:`~pipeline.spec.JobSpec` dump, a stored spec), typed by
the models (each stage's ``params`` by its stage's ``Params``), and finds each secret that holds a value;
:func:`redact`, :func:`restore` and :func:`keep_stored` are built on it. Whatever shows a spec (the API's
responses, the card's ``spec.yaml``) or writes one to a file the service does not keep private (a job's
``run.json``) goes through :func:`redact`: the value becomes :data:`REDACTED`. Sent back (a schedule's
GET-modify-PATCH), :data:`REDACTED` means "the stored value" (:func:`keep_stored`); a spec that still holds it
where it runs is refused (:func:`placeholder_problems`).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterator
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

from pipeline.problems import Loc, Problem

#: the field's JSON schema key that marks a secret
MARK = "x-secret"
#: what a secret's value is replaced with wherever a spec is shown
REDACTED = "<redacted>"
#: a secret string: never shown, never written in clear outside the service's own store
Secret = Annotated[str, Field(json_schema_extra={MARK: True, "writeOnly": True})]
#: a problem's ``kind`` for a secret that holds :data:`REDACTED` where its value is needed
REDACTED_SECRET = "redacted_secret"


def is_secret(field: FieldInfo) -> bool:
    extra = field.json_schema_extra
    return isinstance(extra, dict) and extra.get(MARK) is True


def secrets_of(spec: dict[str, Any]) -> dict[Loc, str]:
    """Each secret of the job spec ``spec`` (its JSON data) that holds a value, by its field path."""
    from pipeline.spec import JobSpec  # the spec's stages import this module's Secret

    return {loc: parent[key] for loc, parent, key in _walk(spec, JobSpec, ())}


def redact(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with each secret's value replaced by :data:`REDACTED` (a copy; ``spec`` itself when it holds none)."""
    found = secrets_of(spec)
    return _replace(spec, dict.fromkeys(found, REDACTED)) if found else spec


def restore(spec: dict[str, Any], values: dict[Loc, str]) -> dict[str, Any]:
    """A copy of the redacted ``spec`` with the secret ``values`` (:func:`secrets_of` of the real one) put back."""
    return _replace(spec, values)


def keep_stored(spec: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
    """``spec`` (an update) with each secret sent as :data:`REDACTED` given the value ``stored`` holds at the
    same field path, so a spec read from a response can be sent back changed elsewhere. One that ``stored``
    has no value for stays :data:`REDACTED` (refused by :func:`placeholder_problems`)."""
    kept = secrets_of(stored)
    return _replace(spec, {loc: kept[loc] for loc, v in secrets_of(spec).items() if v == REDACTED and loc in kept})


def placeholder_problems(spec: dict[str, Any]) -> list[Problem]:
    """A problem at each secret of ``spec`` that holds :data:`REDACTED` instead of a value."""
    return [Problem(loc, f"{REDACTED} is what a response shows for this secret, not its value: send the value",
                    REDACTED_SECRET) for loc, v in secrets_of(spec).items() if v == REDACTED]


def to_json(values: dict[Loc, str]) -> list[dict[str, Any]]:
    """``values`` as JSON data (a list of ``{loc, value}``; a path is no JSON key)."""
    return [{"loc": list(loc), "value": v} for loc, v in values.items()]


def from_json(data: Any) -> dict[Loc, str]:
    return {tuple(item["loc"]): str(item["value"]) for item in data}


def _replace(spec: dict[str, Any], values: dict[Loc, str]) -> dict[str, Any]:
    """A copy of ``spec`` with ``values`` at their paths: the mappings and lists on each path copied, the rest
    shared (every response redacts a spec: no deep copy of all of it)."""
    out = dict(spec)
    for loc, value in values.items():
        parent: Any = out
        for part in loc[:-1]:
            child = parent[part]
            parent[part] = child = dict(child) if isinstance(child, dict) else list(child)
            parent = child
        parent[loc[-1]] = value
    return out


def _walk(data: Any, annotation: Any, loc: Loc) -> Iterator[tuple[Loc, dict[str, Any], str]]:
    """``(path, mapping, key)`` of each secret under ``data`` that holds a non-empty string, ``data`` typed by
    ``annotation``; a part of another shape than its type is skipped (a stored spec is not validated again)."""
    if not _may_hold(annotation):
        return
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if not isinstance(data, dict):
            return
        typed = getattr(annotation, "field_model", None)
        for name, key, secret, sub in _fields(annotation):
            if key not in data:
                continue
            if secret:
                if isinstance(data[key], str) and data[key]:
                    yield (*loc, key), data, key
                continue
            yield from _walk(data[key], (typed(name, data) if typed is not None else None) or sub, (*loc, key))
        return
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        yield from _walk(data, args[0], loc)
    elif origin in (Union, types.UnionType):
        seen: set[Loc] = set()
        for arg in args:
            for found in _walk(data, arg, loc):
                if found[0] not in seen:
                    seen.add(found[0])
                    yield found
    elif origin in (list, tuple) and isinstance(data, list) and args:
        same = len(args) == 1 or args[1] is Ellipsis  # list[X], tuple[X, ...]; else tuple[X, Y]: one type each
        for i, item in enumerate(data if same else data[:len(args)]):
            yield from _walk(item, args[0] if same else args[i], (*loc, i))
    elif origin is dict and isinstance(data, dict) and len(args) == 2:
        for k, v in data.items():
            yield from _walk(v, args[1], (*loc, k))


@functools.cache
def _fields(model: type[BaseModel]) -> tuple[tuple[str, str, bool, Any], ...]:
    """``(name, key, secret, annotation)`` of each field of ``model`` that is or may hold a secret (each one, for
    a model that types a field by its data)."""
    dynamic = hasattr(model, "field_model")
    return tuple((name, f.alias or name, is_secret(f), f.annotation) for name, f in model.model_fields.items()
                 if dynamic or is_secret(f) or _may_hold(f.annotation))


@functools.cache
def _may_hold_cached(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return hasattr(annotation, "field_model") or any(
            is_secret(f) or _may_hold(f.annotation) for f in annotation.model_fields.values())
    return any(_may_hold(arg) for arg in get_args(annotation) if arg is not Ellipsis)


def _may_hold(annotation: Any) -> bool:
    """Whether a value of type ``annotation`` may hold a secret (a model typing a field by its data, a stage entry,
    may): the walk skips the rest of a spec (inputs, output, tokenizer...), since every API response walks one."""
    try:
        return _may_hold_cached(annotation)
    except TypeError:  # an annotation that cannot be a cache key
        return True
