"""The OpenAPI schema as the server answers: every error status a route can return, each with its JSON body.

FastAPI documents what a route declares, and a 422 for one with parameters. What happens around the routes it
does not see: the key check (401 on every route behind a key, 503 when the database does not answer it), the
body's parsing (a 422 problem, :mod:`service.api.json_body`: not JSON or YAML, not UTF-8, nested too deep), and
the body's size and time limits (:mod:`service.api.edge`: 413
and 408, on any request to a route that sends a body; :mod:`service.api.server`: 408 and 431 for a slow or
large head, 503 past the connection limit). :func:`document_errors` adds those where they apply;
gives every 422 the body the handlers send (:class:`~service.api.schemas.ProblemList`, not FastAPI's
``HTTPValidationError`` with its extra fields); states an optional parameter as optional, not as one that may be
``null``; and makes every 4xx and 5xx body ``application/json``, a streaming route's too (``/events``,
``/logs``: their errors are JSON, not events or log text; the 503 past ``--max-connections`` too, see
:mod:`service.api.server`),
so a client and a fuzzer read the same contract.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic.json_schema import models_json_schema

from pipeline.nesting import MAX_DEPTH
from service.api.body_rules import state_service_rules
from service.api.schemas import Message, ProblemList

JSON = "application/json"
REF = "#/components/schemas/{model}"
_MESSAGE = {"$ref": REF.format(model="Message")}
_PROBLEMS = {"$ref": REF.format(model="ProblemList")}
#: (status, description, body) added to every operation behind a key / with a request body / to every one
_KEYED = (("401", "no valid API key (`Authorization: Bearer ...`)", _MESSAGE),
          ("503", "the database does not answer (retry after `Retry-After` seconds), or the process is at "
                  "`--max-connections`", _MESSAGE))
_EVERY = (("408", "the request's head or body did not arrive in time (`--head-timeout-s`, `--body-timeout-s`)",
           _MESSAGE),
          ("413", "the request body is over the limit (`--max-body-bytes`)", _MESSAGE),
          ("431", "the request's headers are over 32 KiB", _MESSAGE),
          ("503", "the process is at `--max-connections`", _MESSAGE))
_INVALID = ("an invalid parameter or body: one problem per field, `loc` its path; a body that cannot be read "
            f"(not JSON or YAML, not UTF-8, nested deeper than {MAX_DEPTH} levels) is one problem at `body`")
#: FastAPI's 422 models, replaced by :class:`ProblemList`
_FASTAPI_422 = ("HTTPValidationError", "ValidationError")


def links(param: str, targets: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """OpenAPI ``links`` of a created resource's response: its ``id`` is ``param`` of each ``{name: (method,
    path)}`` target (what a client, and schemathesis' stateful phase, follow from a 201)."""
    return {name: {"operationRef": f"#/paths/{path.replace('~', '~0').replace('/', '~1')}/{method}",
                   "parameters": {param: "$response.body#/id"}} for name, (method, path) in targets.items()}


def install(app: FastAPI) -> None:
    """Serve :func:`document_errors` of FastAPI's schema, with the service's rules on request bodies
    (:func:`~service.api.body_rules.state_service_rules`), as ``app.openapi()`` (built once, on first use)."""
    build: Callable[[], dict[str, Any]] = app.openapi
    done: list[dict[str, Any]] = []

    def openapi() -> dict[str, Any]:
        if not done:
            schema = document_errors(build())
            state_service_rules(schema, app.state.settings)
            done.append(schema)
        return done[0]

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema


def document_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (FastAPI's, changed in place) with the errors each operation can answer; see the module."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    _, defs = models_json_schema([(Message, "serialization"), (ProblemList, "serialization")], ref_template=REF)
    components.update(defs["$defs"])
    for item in schema.get("paths", {}).values():
        for op in item.values():
            for param in op.get("parameters", ()):
                param["schema"] = _not_null(param.get("schema", {}))
            responses = op.setdefault("responses", {})
            added = list(_KEYED) if op.get("security") else []  # first: its 503 says both reasons
            added += _EVERY
            for code, description, body in added:
                responses.setdefault(code, {"description": description, "content": {JSON: {"schema": body}}})
            if op.get("parameters") or "requestBody" in op:
                fastapi = responses.setdefault("422", {"description": _INVALID})
                if fastapi.get("description") == "Validation Error":
                    fastapi["description"] = _INVALID
            for code, response in responses.items():
                if code[0] in "45":
                    response["content"] = {JSON: {"schema": _PROBLEMS if code == "422" else _error_body(response)}}
    for name in _FASTAPI_422:
        components.pop(name, None)
    return schema


def _not_null(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional parameter's schema without FastAPI's ``anyOf [..., null]``: a parameter left out is absent, and
    no query, path or header value is JSON's null (a client sending ``null`` sends the text ``null``)."""
    options = [o for o in schema.get("anyOf", ()) if o.get("type") != "null"]
    if len(options) != 1 or len(options) == len(schema["anyOf"]):
        return schema
    rest = {k: v for k, v in schema.items() if k != "anyOf"}
    return {**options[0], **rest}


def _error_body(response: dict[str, Any]) -> dict[str, Any]:
    """The schema a route declared for an error (under whatever media type FastAPI put it), else Message."""
    for media in (response.get("content") or {}).values():
        if media.get("schema"):
            return media["schema"]
    return _MESSAGE
