"""The request bodies' schemas with the rules the service checks beyond their pydantic models.

A spec's model is the CLI's too; the service refuses more (:mod:`service.admission`,
:mod:`service.api.mixture_sources`): a U+0000 in any string (422: PostgreSQL cannot store it), an
``execution.address`` other than its own Ray, more CPUs than ``--max-job-cpus``, a mixture source given by
``path``; and a stage's ``params`` are its own ``Params`` model (the spec model checks them after parsing).
:func:`state_service_rules` writes those into the OpenAPI schema of every model a request body holds, with this
server's settings, so that a body the schema allows is one the server takes (what schemathesis'
``positive_data_acceptance`` checks) and a client reads the limits before it sends.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic.json_schema import models_json_schema

from pipeline.stages import known_stages, stage_class
from service.api.schemas import NUL_FREE
from service.settings import Settings

_REF = "#/components/schemas/"


def state_service_rules(schema: dict[str, Any], settings: Settings) -> None:
    """``schema`` (an OpenAPI document, changed in place) with the service's rules on its request bodies."""
    components = schema.get("components", {}).get("schemas", {})
    _type_stage_params(components)
    _one_annotating_stage_each(components)
    for name in _body_models(schema, components):
        _no_nul(components[name])
    if "AblationSpec" in components:  # its open mappings (base, a variant's stages and set) hold any JSON
        components[_NUL_FREE_VALUE] = _nul_free_value()
        for name in _ABLATION_MODELS:
            _deep_nul_free(components.get(name))
    execution = components.get("ExecutionSpec", {}).get("properties", {})
    if "address" in execution:
        # empty or absent: the service's own (admission reads "" as none given)
        allowed = [{"type": "string", "maxLength": 0}, {"type": "null"}]
        if settings.ray_address:
            allowed.insert(0, {"type": "string", "enum": [settings.ray_address]})
        execution["address"]["anyOf"] = allowed
    source = components.get("SourceSpec")
    if source is not None:  # the service blends its own outputs only (service/api/mixture_sources.py)
        source["properties"].pop("path", None)
        for rule in source.get("allOf", ()):
            if "oneOf" in rule:
                rule["oneOf"] = [o for o in rule["oneOf"] if o.get("required") != ["path"]]
    cap = settings.job_cpu_cap
    for name in ("num_cpus", "parallelism"):
        for option in execution.get(name, {}).get("anyOf", ()):
            if cap is not None and option.get("type") == "integer":
                option["maximum"] = cap


def _type_stage_params(components: dict[str, Any]) -> None:
    """``StageSpec`` as a choice on ``type``: one component per registered stage (``StageSpec_<type>``) whose
    ``params`` is the stage's own ``Params`` model (its JSON schema, a component of its own), ``params`` required
    where that schema requires a field. The spec model keeps ``params`` a plain mapping (stages are imported
    only when a spec names them); here, where the schema is built once, every stage is. What is left out is
    what no JSON schema states: a param compared with another (:data:`~pipeline.problems.ACROSS_PARAMS`)."""
    if "StageSpec" not in components:
        return
    models = {name: stage_class(name).Params for name in known_stages()}
    refs, defs = models_json_schema([(model, "validation") for model in models.values()],
                                    ref_template=_REF + "{model}")
    for name, model_schema in defs.get("$defs", {}).items():
        if components.setdefault(name, model_schema) != model_schema:
            raise ValueError(f"two schemas named {name!r}: a stage's Params and another model")
    mapping = {}
    for name, model in models.items():
        component = f"StageSpec_{name}"
        ref = refs[(model, "validation")]
        params_required = bool(components[ref["$ref"].removeprefix(_REF)].get("required"))
        components[component] = {
            "type": "object", "title": f"StageSpec ({name})", "additionalProperties": False,
            "properties": {"type": {"const": name}, "params": ref},
            "required": ["type", "params"] if params_required else ["type"]}
        mapping[name] = _REF + component
    components["StageSpec"] = {"title": "StageSpec", "oneOf": [{"$ref": ref} for ref in mapping.values()],
                               "discriminator": {"propertyName": "type", "mapping": mapping}}


def _one_annotating_stage_each(components: dict[str, Any]) -> None:
    """:meth:`~pipeline.spec.JobSpec._check_across_stages`' ``annotate_conflict`` in the schema: of the stages
    writing one ``meta.filters`` key (their class's ``name``), at most one with ``params.mode: annotate``."""
    stages = components.get("JobSpec", {}).get("properties", {}).get("stages")
    if stages is None:
        return
    keys: dict[str, list[str]] = {}
    for name in known_stages():
        stage = stage_class(name)
        if "mode" in stage.Params.model_fields:
            keys.setdefault(stage.name, []).append(name)
    stages["allOf"] = [{"minContains": 0, "maxContains": 1, "contains": {
        "required": ["type", "params"], "properties": {
            "type": {"enum": names}, "params": {"required": ["mode"], "properties": {"mode": {"const": "annotate"}}}}}}
        for names in keys.values()]


def _body_models(schema: dict[str, Any], components: dict[str, Any]) -> set[str]:
    """The components a request body refers to, directly or through others."""
    seen: set[str] = set()
    todo = [ref for path in schema.get("paths", {}).values() for op in path.values()
            for ref in _refs(op.get("requestBody", {}))]
    while todo:
        name = todo.pop()
        if name not in seen and name in components:
            seen.add(name)
            todo.extend(_refs(components[name]))
    return seen


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_REF):
            yield ref.removeprefix(_REF)
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


#: any JSON value without U+0000 in a string or a key, at any depth: the values of an open mapping of a body
_NUL_FREE_VALUE = "NulFreeValue"


def _nul_free_value() -> dict[str, Any]:
    me = {"$ref": _REF + _NUL_FREE_VALUE}
    return {"anyOf": [{"type": "string", "pattern": NUL_FREE}, {"type": "number"}, {"type": "boolean"},
                      {"type": "null"}, {"type": "array", "items": me},
                      {"type": "object", "propertyNames": {"pattern": NUL_FREE}, "additionalProperties": me}]}


#: the components of an ablation file whose open mappings hold any JSON (``POST /v1/ablations``)
_ABLATION_MODELS = ("AblationSpec", "Variant", "Proxy")


def _deep_nul_free(node: Any) -> None:
    """Every open mapping below ``node``: its values without U+0000 too, at any depth."""
    if isinstance(node, dict):
        if node.get("type") == "object" and node.get("additionalProperties", True) is True:
            node["additionalProperties"] = {"$ref": _REF + _NUL_FREE_VALUE}
        for value in node.values():
            _deep_nul_free(value)
    elif isinstance(node, list):
        for value in node:
            _deep_nul_free(value)


def _no_nul(node: Any) -> None:
    """Every string schema below ``node`` that has no pattern, enum or const of its own, and every key of an
    open mapping: no U+0000."""
    if isinstance(node, dict):
        if node.get("type") == "string" and not {"pattern", "enum", "const"} & node.keys():
            node["pattern"] = NUL_FREE
        if node.get("type") == "object" and node.get("additionalProperties", True) is not False:
            node.setdefault("propertyNames", {"pattern": NUL_FREE})
        for value in node.values():
            _no_nul(value)
    elif isinstance(node, list):
        for value in node:
            _no_nul(value)
