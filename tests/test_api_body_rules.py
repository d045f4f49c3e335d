"""The OpenAPI schema states the rules a request body must follow across its fields (issue 37), and the server
still refuses a body that breaks one, naming the field.

- **In the schema** (checked with a JSON Schema 2020-12 validator against the app's own ``/openapi.json``):
  ``tokenizer: null`` needs ``output.documents``; a schedule's spec (created or updated) needs an
  ``exact_dedup`` or ``near_dedup`` stage; a stage's ``type`` is a known one, and its ``params`` that stage's
  ``Params`` model (unknown params, wrong types, bounds, enums, both-or-neither), all but the rules comparing
  two params, which the model refuses with their own type (``params_across``); one annotating stage per
  ``meta.filters`` key; no string holds U+0000; this server's ``--max-job-cpus`` and Ray address; a mixture
  source is exactly one of ``job`` / ``schedule`` (a ``path`` the service never reads), one of ``weight`` /
  ``tokens``, ``version`` only with ``schedule``.
- **Still refused** (on SQLite and PostgreSQL): each of those a 422 naming the field; an update's spec naming
  another folder than its schedule's is a 409 naming ``spec.output.path`` (the schedule's state, which no schema
  of the body can hold), one with U+0000 in that path a 422, not a 500; a mixture source that does not exist a
  404 naming it (as its own URL answers), two sources of one name a 422 naming the second.

tests/test_api_fuzz.py runs schemathesis against the same schema, live.
"""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from pipeline.problems import ACROSS_PARAMS
from pipeline.spec import StageSpec
from pipeline.stages import REGISTRY
from service.api.app import create_app
from service.settings import Settings
from tests.test_service_api import _spec, api  # noqa: F401 - a fixture
from tests.test_service_store import postgres_url  # noqa: F401 - a fixture


@pytest.fixture(scope="module")
def openapi(tmp_path_factory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("schema")
    app = create_app(Settings(state_dir=tmp / "state", database_url=f"sqlite:///{tmp / 'db'}", run_supervisor=False,
                              input_roots=(tmp,), output_roots=(tmp,), max_job_cpus=2))
    return app.openapi()


def _body_ok(openapi: dict[str, Any], method: str, path: str, body: Any) -> bool:
    """Whether ``body`` is valid for the operation's request body, by the schema alone."""
    schema = openapi["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return Draft202012Validator({**schema, "components": openapi["components"]}).is_valid(body)


JOB = {"name": "j", "inputs": [{"path": "/d/in/*.jsonl"}], "output": {"path": "/d/out"}}
DEDUP = [{"type": "exact_dedup"}]


def _with(body: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**body, **changes}


def test_the_schema_states_the_job_spec_rules(openapi):
    ok = lambda body: _body_ok(openapi, "post", "/v1/jobs", body)  # noqa: E731
    assert ok(JOB) and ok(_with(JOB, tokenizer={"path": "/d/t.json"}))
    assert not ok(_with(JOB, tokenizer=None))  # documents_required
    assert not ok(_with(JOB, tokenizer=None, output={"path": "/d/out", "documents": None}))
    assert ok(_with(JOB, tokenizer=None, output={"path": "/d/out", "documents": "parquet"}))
    assert ok(_with(JOB, stages=DEDUP)) and not ok(_with(JOB, stages=[{"type": "no_such_stage"}]))
    assert not ok(_with(JOB, inputs=[{"path": "/d/in", "text_field": "te\x00xt"}]))  # U+0000
    assert ok(_with(JOB, execution={"num_cpus": 2, "parallelism": 2}))
    assert not ok(_with(JOB, execution={"num_cpus": 3})) and not ok(_with(JOB, execution={"parallelism": 3}))
    assert ok(_with(JOB, execution={"address": None})) and not ok(_with(JOB, execution={"address": "ray://x:1"}))


def _stage_ok(openapi: dict[str, Any], stage: dict[str, Any]) -> bool:
    return _body_ok(openapi, "post", "/v1/jobs", _with(JOB, stages=[stage]))


#: the params a stage requires (decontaminate's in preflight, which the schema states)
REQUIRED = {"quality_classifier": {"model": "/d/m.bin"}, "decontaminate": {"benchmarks": ["/d/b.jsonl"]}}


@pytest.mark.parametrize("stage", sorted(REGISTRY))
def test_the_schema_types_each_stages_params(openapi, stage):
    """Each stage's ``params`` is its ``Params`` model in the schema: an unknown param, or a known one of the
    wrong type, is refused there as the server refuses it (the params' required fields given)."""
    given = REQUIRED.get(stage, {})
    assert _stage_ok(openapi, {"type": stage, "params": given})
    assert not _stage_ok(openapi, {"type": stage, "params": {**given, "no_such_param": 1}})
    assert not _stage_ok(openapi, {"type": stage, "params": {**given, "mode": 3}})
    assert not _stage_ok(openapi, {"type": stage, "params": []})


@pytest.mark.parametrize("stage, valid", [
    ({"type": "length", "params": {"min_chars": "x"}}, False),
    ({"type": "length", "params": {"min_chars": -1}}, False),
    ({"type": "normalize", "params": {"form": "NFC", "strip": False}}, True),
    ({"type": "normalize", "params": {"form": "nope"}}, False),
    ({"type": "quality_classifier"}, False), ({"type": "quality_classifier", "params": {}}, False),  # model
    ({"type": "pii", "params": {"phone_regions": ["DE"]}}, True),
    ({"type": "near_dedup", "params": {"bands": 4, "rows": 8}}, True),
    ({"type": "near_dedup", "params": {"bands": 4}}, False),  # both or neither
    ({"type": "near_dedup", "params": {"bands": None, "rows": 8}}, False),
    ({"type": "near_dedup", "params": {"bands": None, "rows": None}}, True),
    ({"type": "pii", "params": {"entities": ["EMAIL_ADDRESS"]}}, True),
    ({"type": "pii", "params": {"extra_entities": ["NO_SUCH_ENTITY"]}}, False),
    ({"type": "stored_filters", "params": {"rules": [{"filter": "f", "score": "s", "max": 1}]}}, True),
    ({"type": "stored_filters", "params": {"rules": [{"filter": "f", "score": "s", "min": None}]}}, False),
    ({"type": "gopher_repetition", "params": {"top_ngram_char_ratio": {"3": 0.2}}}, True),
    ({"type": "gopher_repetition", "params": {"top_ngram_char_ratio": {"three": 0.2}}}, False),
])
def test_the_schema_states_each_params_rule_of_one_field(openapi, stage, valid):
    assert _stage_ok(openapi, stage) is valid
    try:  # the server's model agrees
        StageSpec.model_validate(stage)
    except ValidationError:
        assert not valid
    else:
        assert valid


def test_the_schema_states_what_preflight_checks_of_params_without_a_file(openapi):
    """A pii region phonenumbers does not know, a decontaminate stage without benchmarks: the model takes them,
    preflight (a 422 too) does not."""
    assert not _stage_ok(openapi, {"type": "pii", "params": {"phone_regions": ["XX"]}})
    assert not _stage_ok(openapi, {"type": "decontaminate"})
    assert not _stage_ok(openapi, {"type": "decontaminate", "params": {"benchmarks": []}})


def test_the_schema_states_one_annotating_stage_per_key(openapi):
    """Two stages writing one ``meta.filters`` key may not both annotate (``annotate_conflict``)."""
    annotate = {"type": "length", "params": {"mode": "annotate"}}
    ok = lambda *stages: _body_ok(openapi, "post", "/v1/jobs", _with(JOB, stages=list(stages)))  # noqa: E731
    assert ok(annotate, {"type": "length"}, {"type": "c4", "params": {"mode": "annotate"}})
    assert ok(annotate, {"type": "length", "params": {"mode": "filter"}})
    assert not ok(annotate, {"type": "normalize"}, annotate)


@pytest.mark.parametrize("stage", [
    {"type": "near_dedup", "params": {"bands": 32, "rows": 8}},  # bands x rows > num_perm
    {"type": "decontaminate", "params": {**REQUIRED["decontaminate"], "ngram": 8, "min_words": 9}},
    {"type": "decontaminate", "params": {**REQUIRED["decontaminate"], "ngram": 8, "min_span": 7}},
    {"type": "pii", "params": {"actions": {"PERSON": "keep"}, "ner_entities": ["LOCATION"]}},
    {"type": "pii", "params": {"default_action": "hash", "salt": "short"}},
])
def test_the_rules_across_params_are_the_only_ones_the_schema_leaves_out(openapi, stage):
    """What the schema cannot state (one param compared with another) is refused by the model, with its own
    ``type`` (what tests/live_api.py lets through schemathesis' positive runs)."""
    assert _stage_ok(openapi, stage)
    with pytest.raises(ValidationError) as err:
        StageSpec.model_validate(stage)
    assert [e["type"] for e in err.value.errors()] == [ACROSS_PARAMS], err.value.errors()


def test_the_schema_states_that_a_schedule_needs_a_dedup_stage(openapi):
    create = {"cron": "@daily", "spec": JOB}
    assert not _body_ok(openapi, "post", "/v1/schedules", create)  # dedup_required
    assert _body_ok(openapi, "post", "/v1/schedules", _with(create, spec=_with(JOB, stages=DEDUP)))
    assert not _body_ok(openapi, "post", "/v1/schedules",
                        _with(create, spec=_with(JOB, stages=[{"type": "length"}])))
    update = "/v1/schedules/{schedule_id}"
    assert not _body_ok(openapi, "patch", update, {"spec": JOB})
    assert _body_ok(openapi, "patch", update, {"spec": _with(JOB, stages=DEDUP)})
    assert _body_ok(openapi, "patch", update, {"name": "n"}) and _body_ok(openapi, "patch", update, {"spec": None})


@pytest.mark.parametrize("source, valid", [
    ({"job": "0123456789abcdef", "weight": 1}, True),
    ({"schedule": "0123456789abcdef", "version": 2, "tokens": 10}, True),
    ({"weight": 1}, False),  # none of job / schedule
    ({"job": "a", "schedule": "b", "weight": 1}, False),  # two
    ({"job": "a", "schedule": None, "weight": 1}, True),  # null is not given
    ({"path": "/d/shards", "weight": 1}, False),  # the service blends its own outputs only
    ({"job": "a"}, False), ({"job": "a", "weight": 1, "tokens": 5}, False),  # one of weight / tokens
    ({"job": "a", "version": 1, "weight": 1}, False),  # version: only with schedule
    ({"schedule": "a", "version": 0, "weight": 1}, False),
])
def test_the_schema_states_the_mixture_source_rules(openapi, source, valid):
    assert _body_ok(openapi, "post", "/v1/mixtures", {"sources": [{"name": "s", **source}]}) is valid


def _refused(r, status: int, *loc: str | int, kind: str | None = None) -> None:
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    if isinstance(detail, str):  # a 409's message names its field first
        assert detail.startswith(".".join(map(str, loc)) + ": "), detail
        return
    assert [p["loc"] for p in detail] == [["body", *loc]], detail
    assert kind is None or detail[0]["type"] == kind, detail


def test_bodies_that_break_a_rule_are_refused_naming_the_field(api):  # noqa: F811 - the imported fixture
    client, headers, root = api
    spec = _spec(root, stages=DEDUP)
    _refused(client.post("/v1/jobs", json=_spec(root, tokenizer=None), headers=headers), 422, "tokenizer",
             kind="documents_required")
    _refused(client.post("/v1/schedules", json={"cron": "@daily", "spec": _spec(root, out="s")}, headers=headers),
             422, "spec", "stages", kind="dedup_required")
    sched = client.post("/v1/schedules", json={"cron": "@daily", "spec": _spec(root, out="s", stages=DEDUP)},
                        headers=headers)
    assert sched.status_code == 201, sched.text
    url = f"/v1/schedules/{sched.json()['id']}"
    _refused(client.patch(url, json={"spec": _spec(root, out="s")}, headers=headers), 422, "spec", "stages",
             kind="dedup_required")
    _refused(client.patch(url, json={"spec": spec}, headers=headers), 409, "spec", "output", "path")
    nul = {**spec, "output": {"path": str(root / "s") + "\x00"}}
    _refused(client.patch(url, json={"spec": nul}, headers=headers), 422, "spec", "output", "path",
             kind="nul_character")
    assert client.patch(url, json={"spec": _spec(root, out="s", stages=DEDUP)}, headers=headers).status_code == 200

    def mix(*sources: dict[str, Any], **extra: Any):
        return client.post("/v1/mixtures", json={"sources": list(sources), **extra}, headers=headers)

    _refused(mix({"name": "a", "weight": 1}), 422, "sources", 0)
    _refused(mix({"name": "a", "job": "0123456789abcdef", "schedule": "0123456789abcdef", "weight": 1}), 422,
             "sources", 0)
    _refused(mix({"name": "a", "job": "0123456789abcdef", "weight": 1}), 404, "sources", 0, "job", kind="mixture")
    _refused(mix({"name": "a", "job": "0123456789abcdef", "weight": 1},
                 {"name": "a", "job": "0123456789abcdee", "weight": 1}), 422, "sources", 1, "name",
             kind="duplicate_name")
    _refused(mix({"name": "a", "job": "0123456789abcdef", "weight": 1}, seed=2**53), 422, "seed")


def test_the_schema_is_a_valid_openapi_document(openapi):
    from openapi_spec_validator import validate

    # FastAPI writes an event stream's items as OpenAPI 3.2's itemSchema, which a 3.1 document may not hold
    validate(_without_item_schemas(openapi))


def _without_item_schemas(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_item_schemas(v) for k, v in node.items() if k != "itemSchema"}
    return [_without_item_schemas(v) for v in node] if isinstance(node, list) else node

